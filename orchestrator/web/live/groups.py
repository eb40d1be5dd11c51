"""The names of the channel-layer groups the relay sends to and the consumers listen on."""

ALL_RUNS = "runs.all"  # superusers' run list: every team


def run_group(run_id) -> str:
    return f"run.{run_id}"


def team_group(team_id: int) -> str:
    return f"runs.team.{team_id}"
