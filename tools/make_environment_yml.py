"""Print environment.yml for conda users, generated from the pins in requirements.txt."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def render() -> str:
    pins = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    lines = [
        "# Generated from requirements.txt by `make environment.yml`; do not edit by hand.",
        "name: rlhf-course",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        "  - python=3.11",
        "  - pip",
        "  - pip:",
    ]
    lines += [f"      - {p}" for p in pins]
    lines.append("      - -e .")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
