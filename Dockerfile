FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 STEPWISE_VAR_DIR=/var/lib/stepwise
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY approvals approvals
COPY audit audit
COPY budgets budgets
RUN pip install --no-cache-dir .
COPY . .
RUN python manage.py collectstatic --noinput -v0
EXPOSE 8000
CMD ["uvicorn", "orchestrator.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
