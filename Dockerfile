FROM python:3.11-slim
# Production settings (docs/security.md): they refuse to start without the secrets, which come
# from the environment at run time (docker-compose.yml, .env), never from the image.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 STEPWISE_VAR_DIR=/var/lib/stepwise \
    STEPWISE_ENV=production
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY approvals approvals
COPY audit audit
COPY budgets budgets
RUN pip install --no-cache-dir .
COPY . .
# collectstatic needs settings but no secret: development settings with throw-away values,
# given here so that nothing is generated into the image.
RUN STEPWISE_ENV=development DJANGO_SECRET_KEY=collectstatic-only AUDIT_REDACTION_KEY=collectstatic-only \
    python manage.py collectstatic --noinput -v0
EXPOSE 8000
CMD ["uvicorn", "orchestrator.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
