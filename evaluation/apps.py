from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "evaluation"
    verbose_name = "Evaluation"

    def ready(self) -> None:
        from orchestrator.engine.events import run_ended

        from .receivers import on_run_ended

        run_ended.connect(on_run_ended, dispatch_uid="evaluation.run_ended")
