#!/usr/bin/env python3
"""Fails when schemathesis' stateful phase left an operation unreached.

Usage: stateful_reach.py OPENAPI_YAML NDJSON_REPORT (include|exclude) PATH_REGEX

Reads the run's NDJSON report (`--report ndjson`) and the document. Every operation the run
selected (paths matching PATH_REGEX for `include`, the others for `exclude`) that takes a
path parameter must have had at least one answer other than 404 in the stateful phase:
only the document's links bring it identifiers that exist, so an operation they never
reached was tested on random identifiers alone. Operations without path parameters are
left to the other phases, which need no data to reach them.
"""

import json
import re
import sys

import yaml

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def selected_operations(document, mode, pattern):
    """`METHOD /path` of every selected operation that takes a path parameter."""
    wanted = set()
    for path, item in document["paths"].items():
        if (re.search(pattern, path) is not None) != (mode == "include"):
            continue
        if "{" not in path:
            continue
        wanted.update(f"{method.upper()} {path}" for method in item if method in METHODS)
    return wanted


def stateful_answers(report):
    """Status codes the stateful phase got, by `METHOD /path`."""
    answers = {}
    with open(report, encoding="utf-8") as lines:
        for line in lines:
            event = json.loads(line).get("ScenarioFinished")
            if not event or event.get("phase") != "stateful":
                continue
            recorder = event["recorder"]
            interactions = recorder.get("interactions", {})
            for key, case in recorder.get("cases", {}).items():
                value = case["value"]
                response = (interactions.get(key) or {}).get("response")
                if response is not None:
                    label = f"{value['method']} {value['path']}"
                    answers.setdefault(label, set()).add(response["status_code"])
    return answers


def main():
    document_path, report, mode, pattern = sys.argv[1:5]
    with open(document_path, encoding="utf-8") as text:
        document = yaml.safe_load(text)
    answers = stateful_answers(report)
    unreached = sorted(
        label
        for label in selected_operations(document, mode, pattern)
        if not answers.get(label, set()) - {404}
    )
    for label in unreached:
        codes = sorted(answers.get(label, set()))
        print(f"stateful phase never reached {label} (answers: {codes or 'none'})", file=sys.stderr)
    if unreached:
        sys.exit(1)
    print(f"stateful phase reached every operation that takes an identifier ({mode} {pattern})")


if __name__ == "__main__":
    main()
