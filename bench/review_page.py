"""The review page of a big run: its size and how long headless Chromium takes to open it.

Writes a synthetic store (``--nodes`` over ``--tenants`` tenants, heavy-tailed sizes as in
``bench/scaling.py --tenants-shape many``), runs ``memforest compress ... --review PAGE.html``
once, then opens the page in a fresh headless Chromium ``--opens`` times (Debian's chromium
and chromium-driver; the first open is a cold start of the browser's renderer) until its
script has run, and prints one JSON line::

    python bench/review_page.py --nodes 1000000 --tenants 100000 --dir runs/review1m
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from memforest_gpu.store.synthetic import heavy_tailed_sizes, write_synthetic_parquet  # noqa: E402


def open_times(page: str, opens: int, driver_path: str = "/usr/bin/chromedriver") -> list[float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait
    opts = Options()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    out = []
    try:
        for _ in range(opens):
            d.get("about:blank")
            t0 = time.perf_counter()
            d.get("file://" + os.path.abspath(page))
            WebDriverWait(d, 120).until(lambda x: x.execute_script(
                "return document.body && document.body.getAttribute('data-ready') === '1'"))
            out.append(round(time.perf_counter() - t0, 2))
    finally:
        d.quit()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--tenants", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--dir", default="runs/review")
    ap.add_argument("--opens", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    src = os.path.join(a.dir, f"in-{a.nodes}-{a.tenants}.parquet")
    if not os.path.exists(src):
        write_synthetic_parquet(src, heavy_tailed_sizes(a.nodes, a.tenants, seed=a.nodes), dim=a.dim)
    out, rep, page = (os.path.join(a.dir, n) for n in ("out.parquet", "report.json", "review.html"))
    for p in (out, rep, page):
        if os.path.exists(p):
            os.unlink(p)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memforest_gpu.cli", "compress", src, out, "--kmeans", "two-level",
                    "--schedule", "matching", "--embedder", "none", "--quiet", "--report", rep, "--review", page],
                   check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(page, encoding="utf-8") as f:
        text = f.read()
    start = text.index('id="review-data">') + len('id="review-data">')
    data = json.loads(text[start:text.index("</script>", start)])
    print(json.dumps({"nodes": a.nodes, "tenants": a.tenants, "run_s": round(wall, 1),
                      "page_mb": round(os.path.getsize(page) / 1e6, 2), "listed": data["sample"]["shown"],
                      "merged_nodes": data["sample"]["of"], "tenant_rows": len(data["tenants"]["tenant"]),
                      "open_s": open_times(page, a.opens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
