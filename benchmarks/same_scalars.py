"""Record the logged scalars of a short seeded run, or compare two recordings: a refactor that keeps every
operation's order must reproduce them bit for bit (timing tags, which measure the machine, are left out).

    python benchmarks/same_scalars.py record OUT.json -- python ppo_continuous.py --seed 1 ...
    python benchmarks/same_scalars.py compare OLD.json NEW.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TIMING = ("charts/SPS", "charts/rollout_us_per_step", "charts/update_us_per_step")


def read_scalars(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict = {}
    for events in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag not in TIMING:
                scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return scalars


def main() -> None:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("record", "compare"))
    parser.add_argument("paths", nargs="+")
    ns = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if ns.mode == "record":
        with tempfile.TemporaryDirectory() as runs:
            subprocess.run([*command, "--runs-dir", runs], check=True)
            Path(ns.paths[0]).write_text(json.dumps(read_scalars(Path(runs)), indent=0))
        return
    old, new = (json.loads(Path(p).read_text()) for p in ns.paths[:2])
    differing = [tag for tag in sorted(old.keys() | new.keys()) if old.get(tag) != new.get(tag)]
    for tag in differing:
        print(f"differs: {tag} ({len(old.get(tag, []))} vs {len(new.get(tag, []))} points)")
    print(f"{len(old.keys() & new.keys()) - len(differing)} tags identical, {len(differing)} differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
