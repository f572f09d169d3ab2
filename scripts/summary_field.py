#!/usr/bin/env python3
"""Prints FIELD of the last {"event":"summary", ...} line of a JSON-lines metrics file
(mnist_train --metrics-out, bench_torch.py, bench_ddp.py); with several fields, their values
on one line, separated by spaces. Usage: summary_field.py FILE FIELD [FIELD...]"""
import json
import sys

summary = None
with open(sys.argv[1]) as lines:
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "summary":
                summary = record
if summary is None:
    sys.exit(f"no summary line in {sys.argv[1]}")
print(*(summary[field] for field in sys.argv[2:]))
