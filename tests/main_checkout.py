"""The main tier's torchtitan (tox -e main): a clone of the bundle of torchtitan main's newest commits, installed
editable into the running Python, so the tier's cells run the bundle's head and its tests can commit on top of it.

    python tests/main_checkout.py FOLDER     # FOLDER: made anew; the bundle: $SIMPLEFSDP_TORCHTITAN_BUNDLE, else
                                             # ../shared/data/torchtitan-main.bundle beside this checkout

Without a bundle it says so and installs nothing: the tier's tests then skip, saying why."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bundle() -> Path | None:
    named = os.environ.get("SIMPLEFSDP_TORCHTITAN_BUNDLE")
    path = Path(named) if named else HERE.parent.parent / "shared" / "data" / "torchtitan-main.bundle"
    return path if path.is_file() else None


def main(folder):
    folder, found = Path(folder), bundle()
    if found is None:
        print("main_checkout: no torchtitan main bundle (set SIMPLEFSDP_TORCHTITAN_BUNDLE); the main tier will skip")
        return 0
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(found), str(folder)], check=True)
    # uv (in the tier's deps), as tox-uv made the env: no pip there, and its files hard links into uv's cache
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    subprocess.run([uv, "pip", "install", "--quiet", "--python", sys.executable, "-e", str(folder)], check=True)
    head = subprocess.run(["git", "-C", str(folder), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    print(f"main_checkout: torchtitan main at {head.stdout.strip()} installed editable from {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
