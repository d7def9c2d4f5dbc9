"""``sglang-edgeacc patches``: every patch, its targets, and whether each applies here."""

from __future__ import annotations

import argparse
import json

from sglang_edgeacc import SGLANG_PIN
from sglang_edgeacc.patches import all_patches
from sglang_edgeacc.patches._base import check_target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")


def collect() -> list[dict]:
    rows = []
    for patch in all_patches():
        statuses = [check_target(target) for target in patch.targets]
        rows.append(
            {
                "patch": patch.name,
                "summary": patch.summary,
                "ok": all(s.ok for s in statuses),
                "targets": [{"target": s.target.path, "ok": s.ok, "detail": s.detail} for s in statuses],
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    import sglang

    rows = collect()
    ok = all(row["ok"] for row in rows)
    if args.json:
        print(json.dumps({"sglang": sglang.__version__, "pin": SGLANG_PIN, "ok": ok, "patches": rows}, indent=2))
        return 0 if ok else 1
    print(f"installed sglang {sglang.__version__} (pinned {SGLANG_PIN})")
    for row in rows:
        print(f"\n[{'ok' if row['ok'] else 'FAIL'}] {row['patch']}: {row['summary']}")
        for target in row["targets"]:
            print(f"    {'ok  ' if target['ok'] else 'FAIL'} {target['target']}  ({target['detail']})")
    print(f"\n{'all patches apply' if ok else 'some patches do not apply: see FAIL above'}")
    return 0 if ok else 1
