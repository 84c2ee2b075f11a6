"""A shell_call's answer under its max_output_length keeps toolfleet's account of what happened
(adapter level, no workers)."""

from __future__ import annotations

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.models import ErrorCode, ToolResult

RESPONSE = {"output": [{"type": "shell_call", "id": "sh_1", "call_id": "s", "status": "completed",
                        "action": {"commands": ["yes | head -c 5000; sleep 60"], "max_output_length": 1000}}]}


def test_a_cancelled_shell_call_with_a_long_output_still_says_it_was_cancelled():
    result = ToolResult.failure("s", "run_command", ErrorCode.CANCELLED,
                                "the turn was cancelled while it ran; it was stopped", output="y\n" * 2500)
    [answer] = get_adapter("openai_responses").format_results([result], response=RESPONSE)
    [entry] = answer["output"]
    assert len(entry["stdout"]) + len(entry["stderr"]) <= 1000
    assert "CANCELLED" in entry["stderr"], entry["stderr"]  # not an unexplained exit code 1
    assert entry["stdout"].startswith("y\ny\n")
