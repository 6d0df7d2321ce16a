"""Headless Chromium for the review page's tests: Debian's ``chromium`` driven by Selenium
through Debian's ``chromium-driver`` (its path given, so Selenium never looks for or fetches
a driver). Skipped where they are missing, failed where extras are required
(:mod:`tests.extras`)."""
import os
import shutil

from extras import need, skip_or_fail

__all__ = ["chromium", "open_page", "page_errors"]

DRIVER = os.environ.get("MEMFOREST_CHROMEDRIVER", "/usr/bin/chromedriver")
_ERRORS = ("window.__errors = []; window.addEventListener('error', e => window.__errors.push(String(e.message))); "
           "window.addEventListener('securitypolicyviolation', e => window.__errors.push('CSP: ' + e.blockedURI));"
           "window.alert = (m) => window.__errors.push('alert: ' + m);")


def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium session (close it with ``quit()``)."""
    need("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None or not os.path.exists(DRIVER):
        skip_or_fail("Debian's chromium and chromium-driver are not installed "
                     "(apt-get install chromium chromium-driver)")
    opts = Options()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _ERRORS})
    return driver


def open_page(driver, path: str, timeout: float = 30.0) -> float:
    """Load ``path`` and wait until its script has run; returns the seconds it took."""
    import time

    from selenium.webdriver.support.ui import WebDriverWait
    t0 = time.perf_counter()
    driver.get("file://" + os.path.abspath(path))
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body && document.body.getAttribute('data-ready') === '1'"))
    return time.perf_counter() - t0


def page_errors(driver) -> list[str]:
    """Script errors, CSP violations, alerts and console errors since the page opened."""
    errs = list(driver.execute_script("return window.__errors || []"))
    errs += [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    return errs
