"""An image folder larger than the memory budget: decoded once into memory vs streamed from disk.

The issue: "a folder of 100,000 full-size photos trains within 24 GB". A folder whose
decoded images fit ``data.cache_mb`` is decoded once and kept in memory; a larger one is
streamed: each batch read and decoded from disk (Pillow's JPEG draft mode: a large photo
decodes at reduced scale) by ``train.workers`` DataLoader processes beside training.

What it does
------------
1. Generates (once; reused while its settings match the stamp file ``.bench.json``) a
   folder ``root/<class>/<image>.jpg`` of synthetic "photos" (smooth random colour fields
   with a class tint, plus noise; JPEG quality 90, ~50-90 KB at 640x480), and prints its
   size on disk.
2. Trains the ``image-folder`` recipe (``attention_cnn_fast``, 64x64, batch 64,
   augmentation, channels-last) on it, each measurement in a fresh process so that its
   peak memory is its own:

   * ``memory``: ``data.cache=memory`` (every image decoded once, in this process);
   * ``stream``: ``data.cache=auto`` with ``data.cache_mb`` below the decoded size, so
     that auto streams (checked), with ``train.workers`` 0, 1, 2. The first stream run
     starts with the folder evicted from the page cache (``posix_fadvise``) and is shown
     as ``cold``; the later runs read it from a warm page cache.

   Each reports the seconds to build the data set (the memory path decodes everything;
   the stream path reads each file's header), the training images/s over the steps after
   the first ``--warmup`` (stamped per step through the trainer's log; only the steps
   during which other processes kept under 0.25 cores busy, from /proc/stat, so that a
   test suite running beside it does not skew the figures, unless too few were), the
   training process's peak RSS (``VmHWM``), the largest DataLoader worker's peak RSS
   (``RUSAGE_CHILDREN``), and the peak PSS of the whole process tree (sampled by this
   script every 0.2 s; PSS shares the pages workers inherit, so it is the memory the run
   really takes).
3. Times one decode (read + draft-mode decode to 64x64) of the folder's images and of
   one synthetic 12-megapixel photo, and extrapolates memory to 100,000 images.

Run (from the repository root; the default run takes about 6 minutes on 2 idle cores, plus 2
to generate the folder the first time)::

    .venv/bin/python benchmarks/image_folder_stream.py --quick     # smoke run: 200 images, few steps
    .venv/bin/python benchmarks/image_folder_stream.py             # 4,000 images 640x480, budget 32 MB
    .venv/bin/python benchmarks/image_folder_stream.py --images 8000 --cache-mb 64 --workers 1 2 --steps 120
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import busy_cores, cpu_model  # benchmarks/common.py, beside this script

STAMP = ".bench.json"  # in the folder's root: scan_images skips dot files
FORMAT = 1  # bump when the generator changes, so that old folders are regenerated


# ----------------------------------------------------------------------------- the folder


def photo(rng: np.random.Generator, w: int, h: int, cls: int, classes: int) -> Image.Image:
    """A synthetic photo: three octaves of smooth random colour, a class tint, pixel noise."""
    img = np.zeros((h, w, 3), np.float32)
    for cells, amp in ((4, 70.0), (16, 35.0), (64, 15.0)):
        small = rng.normal(0, 1, (max(2, cells * h // w), cells, 3))
        field = Image.fromarray(((small + 4) * 32).clip(0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
        img += np.asarray(field, np.float32) * (amp / 128) - amp
    angle = 2 * np.pi * cls / classes
    img += 128 + 30 * np.cos(angle + np.array([0.0, 2.1, 4.2], np.float32))
    img += rng.normal(0, rng.uniform(3, 7), img.shape).astype(np.float32)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def _write(job: tuple[str, int, int, int, int, int, int]) -> int:
    folder, start, stop, classes, w, h, seed = job
    total = 0
    for i in range(start, stop):
        cls = i % classes
        path = Path(folder, f"class_{cls:02d}", f"img_{i:06d}.jpg")
        photo(np.random.default_rng([seed, i]), w, h, cls, classes).save(path, "JPEG", quality=90)
        total += path.stat().st_size
    return total


def make_folder(folder: Path, images: int, classes: int, w: int, h: int, seed: int = 0) -> None:
    settings = {"format": FORMAT, "images": images, "classes": classes, "width": w, "height": h, "seed": seed}
    stamp = folder / STAMP
    if stamp.is_file():
        if json.loads(stamp.read_text()) == settings:
            print(f"reusing {folder} ({images:,} images, {w}x{h}, {classes} classes)")
            return
        shutil.rmtree(folder)  # our own folder, made with other settings
    elif folder.exists() and any(folder.iterdir()):
        sys.exit(f"{folder} exists and was not made by this benchmark (no {STAMP}); choose another --folder")
    for c in range(classes):
        (folder / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    procs = min(2, os.cpu_count() or 1)
    step = -(-images // (procs * 8))
    jobs = [(str(folder), s, min(s + step, images), classes, w, h, seed) for s in range(0, images, step)]
    start = time.perf_counter()
    with ProcessPoolExecutor(procs) as pool:
        total = sum(pool.map(_write, jobs))
    stamp.write_text(json.dumps(settings))
    print(f"generated {images:,} JPEGs {w}x{h} into {folder} in {time.perf_counter() - start:.0f} s "
          f"({total / images / 1e3:.0f} KB each)")


def folder_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.jpg"))


def evict(files: list[Path]) -> None:
    """Drop the files from the page cache (written back first), so that the next read is from disk."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- one measurement (child)


def child(spec: dict) -> None:
    """Build the data as ``attnlab train image-folder`` does and time ``Trainer.fit``; print RESULT json."""
    import gc

    import torch

    from attnlab.engine.trainer import Trainer
    from attnlab.recipes import load_recipe
    from attnlab.run.task import get_task
    from attnlab.data.source import source_of

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    recipe = load_recipe("image-folder", [
        f"data.root={spec['folder']}", f"data.img_size={spec['img_size']}", f"data.cache={spec['cache']}",
        f"data.cache_mb={spec['cache_mb']}", "data.val_size=0", "data.test_size=0.05",
        f"train.steps={spec['steps']}", f"train.batch_size={spec['batch_size']}", f"train.workers={spec['workers']}",
        "train.eval_every=0", "train.checkpoint_every=0", "train.log_every=1", "train.progress=false",
        "train.tensorboard=false", "train.device=cpu", f"train.warmup_steps={min(60, spec['steps'])}",
    ])
    start = time.perf_counter()
    splits = source_of(recipe.data).load(recipe.data)
    classes, train = splits.classes, splits.train
    build_s = time.perf_counter() - start
    streamed = train.ds.images is None
    samples = train.ds.samples
    list_bytes = sys.getsizeof(samples) + sum(sys.getsizeof(s) + sys.getsizeof(s[0]) for s in samples)

    torch.manual_seed(recipe.train.seed)
    model = get_task("image_classification").build_model(recipe, classes)
    stamps: dict[int, float] = {}

    def log(msg: str) -> None:  # "step N/S  loss ...", once a step (log_every=1)
        if msg.startswith("step "):
            stamps[int(msg.split()[1].split("/")[0])] = time.monotonic()  # one clock for all processes

    trainer = Trainer(model, train, recipe.train, log=log)
    fit_start = stamps[0] = time.monotonic()
    trainer.fit()
    fit_s = time.monotonic() - fit_start
    gc.collect()  # the batch iterator is gone: DataLoader workers are joined, RUSAGE_CHILDREN counts them
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps({
        "streamed": streamed, "train_images": len(train), "build_s": build_s, "fit_s": fit_s,
        "stamps": [stamps[k] for k in range(spec["steps"] + 1)],
        "first_step_s": stamps[1] - fit_start, "hwm_mb": hwm / 1024,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "list_bytes_per_image": list_bytes / len(samples), "threads": torch.get_num_threads(),
        "cpu_s": sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                     for f in ("ru_utime", "ru_stime")),
    }), flush=True)


# ----------------------------------------------------------------------------- the parent


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return pids


def _pss_mb(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting on I/O), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) of the live processes ``pids``, from /proc/<pid>/stat."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


QUIET = 0.25  # cores of other work below which a training step counts as measured on a quiet machine


def measure(spec: dict) -> dict:
    """Run ``child(spec)`` in a fresh interpreter, sampling every 0.2 s the process tree's PSS
    and the CPU time that other processes take. The images/s count the steps after the
    warm-up during which other processes kept fewer than ``QUIET`` cores busy (``quiet``
    of them); ``others``: the cores other processes kept busy over the whole run."""
    wall0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                            text=True)
    peak, samples = 0.0, []  # (time, CPU seconds of everything but this tree and this script)
    while proc.poll() is None:
        pids = _tree(proc.pid)
        peak = max(peak, _pss_mb(pids))
        samples.append((time.monotonic(), _busy_seconds() - _cpu_seconds(pids) - sum(os.times()[:2])))
        time.sleep(0.2)
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"measurement {spec} failed (exit {proc.returncode}):\n{out}")
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    wall = time.monotonic() - wall0
    t, other = np.array(samples).T
    stamps = np.array(result.pop("stamps"))
    steps = np.arange(spec["warmup"] + 1, spec["steps"] + 1)
    seconds = stamps[steps] - stamps[steps - 1]
    load = (np.interp(stamps[steps], t, other) - np.interp(stamps[steps - 1], t, other)) / seconds
    quiet = load < QUIET
    counted = quiet if quiet.sum() >= max(5, len(steps) // 4) else np.ones_like(quiet)  # too few: all of them
    return {**result, "pss_mb": peak, "wall_s": wall, "quiet": int(quiet.sum()), "measured": len(steps),
            "rate": spec["batch_size"] * counted.sum() / seconds[counted].sum(),
            "rate_all": spec["batch_size"] * len(steps) / seconds.sum(),
            "others": max(0.0, (other[-1] - other[0]) / (t[-1] - t[0])) if len(t) > 1 else 0.0}


def decode_ms(files: list[Path], size: int, repeats: int = 1) -> float:
    """Milliseconds per image of what a worker does per file: read it, open it, draft-decode it to size."""
    from attnlab.data.readers.images import decode_image

    start = time.perf_counter()
    for _ in range(repeats):
        for p in files:
            with Image.open(io.BytesIO(p.read_bytes())) as im:
                decode_image(im, "RGB", size, "crop")
    return (time.perf_counter() - start) * 1e3 / (len(files) * repeats)


def big_photo_decode_ms(size: int, w: int = 4032, h: int = 3024) -> tuple[float, float]:
    """(ms per draft decode to size, KB) of one synthetic 12-megapixel JPEG, decoded from memory."""
    from attnlab.data.readers.images import decode_image

    buf = io.BytesIO()
    photo(np.random.default_rng(1), w, h, 0, 10).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        with Image.open(io.BytesIO(data)) as im:
            decode_image(im, "RGB", size, "crop")
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3, len(data) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 images, 12 steps, budget 1 MB")
    parser.add_argument("--folder", type=Path, help="default /tmp/attnlab-stream-bench (-quick with --quick)")
    parser.add_argument("--images", type=int, help="default 4000 (200 with --quick)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--photo", default="640x480", help="generated photo size, WxH")
    parser.add_argument("--img-size", type=int, default=64, help="data.img_size")
    parser.add_argument("--cache-mb", type=float, help="data.cache_mb, the memory budget (default 32; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="training steps per measurement (default 100; 12 with --quick)")
    parser.add_argument("--warmup", type=int, help="first steps left out of images/s (default 20; 4 with --quick)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="train.workers of the stream runs")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the training process (0: default)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))

    quick = args.quick
    folder = args.folder or Path("/tmp/attnlab-stream-bench" + ("-quick" if quick else ""))
    images = args.images or (200 if quick else 4000)
    cache_mb = args.cache_mb if args.cache_mb is not None else (1.0 if quick else 32.0)
    steps = args.steps or (12 if quick else 100)
    warmup = args.warmup if args.warmup is not None else (4 if quick else 20)
    if not 0 < warmup < steps:
        sys.exit(f"--warmup must lie between 0 and --steps ({steps}); got {warmup}")
    w, h = (int(v) for v in args.photo.lower().split("x"))

    make_folder(folder, images, args.classes, w, h)
    files = folder_files(folder)
    disk_mb = sum(p.stat().st_size for p in files) / 2**20
    decoded_mb = len(files) * 3 * args.img_size**2 / 2**20
    print(f"folder: {len(files):,} images, {disk_mb:,.0f} MiB on disk; decoded at {args.img_size}x{args.img_size}: "
          f"{decoded_mb:,.1f} MiB; budget data.cache_mb={cache_mb:g} -> data.cache=auto "
          f"{'streams' if decoded_mb > cache_mb else 'keeps them in memory'}")
    if decoded_mb <= cache_mb:
        print("warning: the decoded folder fits the budget, so auto caches it; raise --images or lower --cache-mb")
    busy = busy_cores()
    if busy is not None and busy > 0.3:
        print(f"warning: {busy:.1f} cores are busy with other work; the figures will be low and noisy")

    base = {"folder": str(folder), "img_size": args.img_size, "cache_mb": cache_mb, "steps": steps, "warmup": warmup,
            "batch_size": args.batch_size, "threads": args.threads}
    runs: list[tuple[str, dict]] = [("memory", {**base, "cache": "memory", "workers": 0})]
    order = sorted(args.workers, key=lambda k: (k != 1, k))  # the cold run with 1 worker, when asked for
    runs.append(("stream, cold", {**base, "cache": "auto", "workers": order[0]}))
    runs += [("stream", {**base, "cache": "auto", "workers": k}) for k in order]
    results = []
    for label, spec in runs:
        if label == "stream, cold":
            evict(files)
        print(f"measuring {label}, workers {spec['workers']} ...", flush=True)
        r = measure(spec)
        if label.startswith("stream") and not r["streamed"]:
            print(f"warning: data.cache=auto kept the images in memory (budget {cache_mb:g} MiB)")
        results.append((label, spec, r))
        print(f"  {r['rate']:.0f} images/s ({r['quiet']} of {r['measured']} steps quiet; all: {r['rate_all']:.0f}), "
              f"build {r['build_s']:.1f} s, peak RSS {r['hwm_mb']:.0f} MiB, {r['wall_s']:.0f} s", flush=True)
        if r["others"] > 0.2:
            print(f"  warning: other processes kept {r['others']:.1f} cores busy during this run")

    import torch

    mem = results[0][2]
    print(f"\nImage folder, cached vs streamed; {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{mem['threads']} torch threads, Pillow {Image.__version__}")
    print(f"{len(files):,} JPEGs {w}x{h} ({disk_mb:,.0f} MiB on disk), {mem['train_images']:,} trained on, "
          f"img_size {args.img_size}, batch {args.batch_size}, attention_cnn_fast (image-folder recipe); "
          f"images/s over steps {warmup + 1}-{steps}, those during which other processes kept under {QUIET} "
          f"cores busy (all of them when fewer than a quarter were); budget data.cache_mb={cache_mb:g} "
          f"(decoded folder: {decoded_mb:.1f} MiB)\n")
    print("| path | data.cache | workers | build s | train images/s | vs cached | peak RSS MiB (trainer) "
          "| peak RSS MiB (each worker) | peak PSS MiB (all processes) | quiet steps | other load, cores |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, spec, r in results:
        chosen = spec["cache"] + (" -> stream" if r["streamed"] and spec["cache"] == "auto" else
                                  " -> memory" if spec["cache"] == "auto" else "")
        wk = f"{r['worker_maxrss_mb']:.0f}" if spec["workers"] else "-"
        print(f"| {label} | {chosen} | {spec['workers']} | {r['build_s']:.1f} | {r['rate']:.0f} | "
              f"{r['rate'] / mem['rate']:.2f} | {r['hwm_mb']:.0f} | {wk} | {r['pss_mb']:.0f} | "
              f"{r['quiet']}/{r['measured']} | {r['others']:.1f} |")

    sample = files[:: max(1, len(files) // 100)][:100]
    small_ms = decode_ms(sample, args.img_size)
    big_ms, big_kb = big_photo_decode_ms(args.img_size)
    trainer_rate = mem["rate"]
    print(f"\nDecoding (one core, warm page cache): {small_ms:.2f} ms per {w}x{h} image "
          f"({1e3 / small_ms:,.0f} images/s); {big_ms:.1f} ms per 4032x3024 photo ({big_kb:,.0f} KB; "
          f"{1e3 / big_ms:,.0f} images/s) -> {args.img_size}x{args.img_size}. The cached path trains "
          f"{trainer_rate:,.0f} images/s, so a stream of full-size photos needs "
          f"{trainer_rate * big_ms / 1e3:.1f} cores of decoding to keep up.")

    streams = [r for label, _, r in results if label == "stream"]
    stream_peak = max(r["pss_mb"] for r in streams)
    cache_excess = mem["pss_mb"] - min(r["pss_mb"] for r in streams)
    factor = cache_excess / decoded_mb
    if decoded_mb >= 16:
        measured = (f" (here its peak exceeded the stream path's by {cache_excess:.0f} MiB = {factor:.1f}x the "
                    f"{decoded_mb:.0f} MiB cache: ~{factor * 1e5 * 3 * 224**2 / 2**30:.0f} GiB at 224 while decoding)")
    else:
        measured = f" (the {decoded_mb:.1f} MiB cache here is too small to measure its overhead)"
    per_image = max(r["list_bytes_per_image"] for r in streams)
    print(f"\nExtrapolation to 100,000 images: the cached path holds N x 3 x S x S bytes = "
          f"{1e5 * 3 * 64**2 / 2**30:.2f} GiB at img_size 64, {1e5 * 3 * 224**2 / 2**30:.2f} GiB at 224"
          f"{measured}. "
          f"The stream path peaked at {stream_peak:.0f} MiB (all processes) and keeps only the file list, "
          f"{per_image:.0f} bytes per image ({per_image * 1e5 / 2**20:.0f} MiB for 100,000), "
          f"so its memory does not grow with the images' number or size on disk.")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "torch": torch.__version__, "images": len(files),
                                         "disk_mb": disk_mb, "decoded_mb": decoded_mb, "cache_mb": cache_mb,
                                         "runs": [{"label": lab, **spec, **r} for lab, spec, r in results],
                                         "decode_ms": small_ms, "big_photo_decode_ms": big_ms}, indent=1))


if __name__ == "__main__":
    main()
