"""Which draft start drafts better per unit of cost: held-out top-1 agreement with the target (from each
`laser train-draft` work directory's report.json) beside one cached decoding forward of each draft and of
the target, measured here on one thread.

    python scripts/compare_drafts.py OUTPUT_PATH/draft-training NAME... [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import laser
from benchmarks.report import machine_info
from training.draft import step_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work_root", type=Path)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = laser.load_model(args.target, device="cpu", dtype="float32").model
    rows = {"target": {"step_ms": step_ms(target)}, "machine": machine_info()}
    for name in args.names:
        report = json.loads((args.work_root / name / "report.json").read_text())
        draft = laser.load_model(name, device="cpu", dtype="float32").model
        ms = step_ms(draft)
        rows[name] = {
            "init": report["settings"]["init"],
            "steps": report["steps"],
            "step_ms": ms,
            "cost_vs_target": ms / rows["target"]["step_ms"],
            "agreement_before": report["agreement_before"],
            "agreement_after": report["agreement_after"],
            "agreement_per_cost": report["agreement_after"] / (ms / rows["target"]["step_ms"]),
        }
        print(
            f"{name:28s} {rows[name]['init']:12s} {report['steps']:4d} steps  agreement "
            f"{report['agreement_before']:.1%} -> {report['agreement_after']:.1%}  step {ms:.1f} ms "
            f"({rows[name]['cost_vs_target']:.2f} x target {rows['target']['step_ms']:.1f} ms)"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
