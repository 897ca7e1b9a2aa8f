"""Writes problems.jsonl: arithmetic word problems from reasoning-gym's `basic_arithmetic`
generator as a plain JSONL file (question, answer, and the generator's fields), the kind of
file a user brings. Run from the repository root:

    python examples/own_task/make_problems.py --rows 2000
"""

import argparse
import json
from pathlib import Path

import reasoning_gym


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = reasoning_gym.create_dataset("basic_arithmetic", seed=args.seed, size=args.rows,
                                        min_terms=2, max_terms=3, min_digits=1, max_digits=2)
    out = Path(__file__).with_name("problems.jsonl")
    with out.open("w") as f:
        for entry in rows:
            meta = entry["metadata"]
            f.write(json.dumps({"question": entry["question"], "answer": entry["answer"],
                                "expression": meta["expression"],
                                "num_terms": meta["num_terms"]}) + "\n")
    print(f"wrote {args.rows} problems to {out}")


if __name__ == "__main__":
    main()
