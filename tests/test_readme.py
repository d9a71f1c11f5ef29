"""The README quotes the committed GPU runs: every number in a run's results section must be in that run's
report (the report is built from the committed tables, so the README cannot drift from them)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A number standing alone (not inside 'H200', 'fp16' or a hash), optionally followed by 'x' (a ratio).
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)*(?:e[-+]\d+)?)(?=x\b|[^\w]|$)")


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text.replace("\\|", "|"))


def matches(quoted: str, found: set[str]) -> bool:
    """'1.4' matches '1.4' or '1.403' (the README may round); versions and integers match exactly."""
    if quoted in found:
        return True
    if quoted.count(".") != 1 or "e" in quoted:
        return False
    digits = len(quoted.split(".")[1])
    return any(f.count(".") <= 1 and round(float(f), digits) == float(quoted) for f in found)


@pytest.mark.parametrize("heading, run, at_least", [("What the committed H200 run shows", "nvidia-h200", 40),
                                                     ("The same code on an H100", "nvidia-h100-80gb-hbm3", 30)])
def test_every_number_in_a_results_section_is_in_its_runs_report(heading, run, at_least):
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    report = (ROOT / f"results/{run}/report.md").read_text()
    found = set(numbers(report))
    quoted = numbers(section)
    assert len(quoted) > at_least  # the section does quote the run
    missing = [q for q in quoted if not matches(q, found)]
    assert not missing, f"README numbers not in results/{run}/report.md: {missing}"


def test_the_verdict_tally_is_the_committed_reports():
    """Small counts (11, 6, 3) appear somewhere in any report, so the tally is checked as a whole."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    report = (ROOT / "results/nvidia-h200/report.md").read_text()
    tally = report.split("## Claims", 1)[1].strip().splitlines()[0]
    assert re.fullmatch(r"\d+ [a-z].*", tally), tally  # the line that counts the verdicts
    assert tally in readme, f"README does not quote the report's verdict tally: {tally!r}"
    total = sum(int(n) for n in re.findall(r"(?:^|, )(\d+) ", tally))
    assert f"{total - 3} claims of the writeup and 3 findings" in readme


def test_the_number_check_can_fail():
    found = set(numbers("copy 4225 GB/s, ratio 1.403x, torch 2.11.0+cu130, commit `c52fb3b`"))
    assert matches("4225", found) and matches("1.4", found) and matches("2.11.0", found)
    assert not matches("4226", found) and not matches("1.41", found) and not matches("52", found)


def test_every_number_in_the_comparing_runs_paragraph_is_in_a_committed_comparison():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("**Comparing runs.**", 1)[1].split("**Several GPUs.**", 1)[0]
    found = set()
    for page in (ROOT / "results/compare").glob("*.md"):
        found |= set(numbers(page.read_text()))
    quoted = numbers(paragraph)
    assert len(quoted) >= 8
    missing = [q for q in quoted if not matches(q, found)]
    assert not missing, f"README comparison numbers not in results/compare/*.md: {missing}"
