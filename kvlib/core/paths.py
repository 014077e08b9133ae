"""Where the repository's own files are: one definition for every module that reads them."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the clone: kvlib/, solutions/, notebooks/, assets/
ASSETS = ROOT / "assets"  # the trained tiny model, recorded GPU runs, the recorded GQA study
