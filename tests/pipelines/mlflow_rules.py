"""MLflow scorers (``@scorer``) a team already has, used as metrics of its own as they are."""

from __future__ import annotations

from typing import Any

from mlflow.entities import Feedback
from mlflow.genai.scorers import scorer

CALLS: list[dict[str, Any]] = []


@scorer
def mentions_reference(outputs: str, expectations: dict[str, Any]) -> Feedback:
    """Every expected fact in the answer, as MLflow scorers are written."""
    CALLS.append({"outputs": outputs, "expectations": expectations})
    facts = expectations.get("expected_facts", [])
    missing = [fact for fact in facts if fact not in outputs]
    return Feedback(value=not missing, rationale=f"missing {missing[0]}" if missing else "every fact is there")


@scorer
def polite(inputs: dict[str, Any], outputs: str) -> str:
    """MLflow's yes/no answer."""
    return "no" if "stupid" in outputs else "yes"


@scorer
def over_the_trace(trace: Any) -> bool:
    return True
