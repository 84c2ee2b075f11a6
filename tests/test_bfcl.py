"""BFCL's function definitions and ground truth, as toolfleet tools (validation only, no worker).

(a) Every ground-truth call of BFCL_v4_parallel and BFCL_v4_parallel_multiple (first possible
answer of each parameter) validates, except two that contradict their own function's declared
types (KNOWN_DEFECTS): those are refused on exactly the parameters at fault. (b) Changed copies
fail with INVALID_ARGUMENT naming the parameter: a required parameter dropped, a wrong type, an
unknown parameter. The counts are printed. Data loading is explained in tests/bfcl.py.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from toolfleet import ErrorCode, ToolCall
from toolfleet.tools.validation import check_call

from . import bfcl

# Ground-truth calls that contradict their own function's declared types (BFCL data defects; BFCL's
# own type checker refuses them too): (entry id, call number) -> the parameters at fault.
KNOWN_DEFECTS = {
    ("parallel_multiple_21", 1): {"/x", "/y"},  # "data['sales']" for an array of floats
    ("parallel_multiple_94", 0): {"/elements/0", "/elements/1", "/elements/2", "/elements/3", "/elements/4"},
    # fruit names for an array of integers
}
WRONG = {"string": 12345, "integer": "12", "number": "1.5", "boolean": "yes", "array": "a, b", "object": "k=v"}


def expect_invalid(registry, name: str, arguments: dict, parameter: str, keyword: str) -> None:
    result = check_call(registry, ToolCall(id="m", name=name, arguments=json.dumps(arguments)))
    assert not isinstance(result, tuple), f"{name}: {keyword} on {parameter!r} was accepted: {arguments}"
    assert result.code == ErrorCode.INVALID_ARGUMENT, result.content
    pointers = {e["pointer"]: e for e in result.data["errors"]}
    assert f"/{parameter}" in pointers, f"{name}: {parameter!r} not named in {result.content}"
    assert pointers[f"/{parameter}"]["keyword"] == keyword
    assert parameter in result.content


@pytest.mark.parametrize("file", bfcl.FILES)
def test_bfcl_ground_truth_validates_and_mutants_fail(file, capsys):
    questions = {e["id"]: e for e in bfcl.read(file)}
    answers = bfcl.read(f"possible_answer/{file}")
    counts: Counter[str] = Counter(entries=len(answers))
    assert len(answers) == len(questions) == 200
    for answer in answers:
        functions = questions[answer["id"]]["function"]
        registry = bfcl.registry(functions)
        schemas = {bfcl.tool_name(f["name"]): f["parameters"] for f in functions}
        for number, expected in enumerate(answer["ground_truth"]):
            (raw_name, params), = expected.items()
            name = bfcl.tool_name(raw_name)
            declared = schemas[name]["properties"]
            arguments = {}
            for param, values in params.items():
                present, value = bfcl.first_answer(values)
                if param not in declared:
                    # ground truth names a parameter the function does not declare; BFCL's own
                    # checker refuses it when given and accepts it left out ("" is a possible answer)
                    assert "" in values, f"{answer['id']}: {param!r} undeclared and not omittable"
                    counts["undeclared_in_ground_truth_left_out"] += 1
                    continue
                if present:
                    arguments[param] = value
            call = ToolCall(id=f"{answer['id']}-{number}", name=name, arguments=json.dumps(arguments))
            outcome = check_call(registry, call)
            defect = KNOWN_DEFECTS.get((answer["id"], number))
            if defect is not None:
                assert not isinstance(outcome, tuple) and outcome.code == ErrorCode.INVALID_ARGUMENT
                assert {e["pointer"] for e in outcome.data["errors"]} == defect, outcome.content
                assert {e["keyword"] for e in outcome.data["errors"]} == {"type"}
                counts["ground_truth_against_its_schema_refused"] += 1
                continue
            assert isinstance(outcome, tuple), f"{answer['id']} {name}: {outcome.content}"
            counts["calls_valid"] += 1

            schema = registry.get(name).parameters
            required = [p for p in schema.get("required", []) if p in arguments]
            if required:
                dropped = {k: v for k, v in arguments.items() if k != required[0]}
                expect_invalid(registry, name, dropped, required[0], "required")
                counts["mutant_required_dropped"] += 1
            typed = [(p, schema["properties"][p]["type"]) for p in arguments if "type" in schema["properties"][p]]
            if typed:
                param, kind = typed[0]
                expect_invalid(registry, name, {**arguments, param: WRONG[kind]}, param, "type")
                counts["mutant_wrong_type"] += 1
            expect_invalid(registry, name, {**arguments, "not_a_parameter": 1}, "not_a_parameter",
                           "additionalProperties")
            counts["mutant_unknown_parameter"] += 1
    with capsys.disabled():
        print(f"\nBFCL {file}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    assert counts["calls_valid"] >= counts["entries"]
    expected_defects = sum(1 for (entry, _) in KNOWN_DEFECTS if entry in questions)
    assert counts["ground_truth_against_its_schema_refused"] == expected_defects
