"""Agent steps: render the prompt, ask the model, validate the proposal against its schema."""
from budgets.services import cost_of

from ..definitions import TemplateError, render_template
from ..providers import ModelRequest, provider_for
from ..retry import StepError
from . import ExecContext, Result
from .schemas import validate_output


def run(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    provider, config = provider_for(spec["model"])
    try:
        prompt = render_template(spec["prompt"], step_input)
        system = render_template(spec["system"], step_input) if spec.get("system") else ""
    except TemplateError as exc:
        raise StepError("validation", f"prompt could not be rendered: {exc}") from exc
    reply = provider.complete(ModelRequest(
        model=config.get("model_id", spec["model"]), prompt=prompt, system=system,
        output_schema=spec.get("output_schema"), temperature=spec.get("temperature"),
        max_tokens=spec.get("max_tokens"), script=spec.get("script") or [],
        context=step_input, fixture_key=f"{ctx.workflow}.{ctx.step_name}",
    ))
    validate_output(spec.get("output_schema"), reply.output)
    return Result(reply.output, reply.tokens_in, reply.tokens_out,
                  cost_of(config, reply.tokens_in, reply.tokens_out), spec["model"], provider.name)
