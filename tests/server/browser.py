"""Debian's chromium, headless, driven by selenium (chromedriver from the chromium-driver
package; scripts/setup.sh installs both when apt is there). `why_no_browser()` says why a test
must skip."""

from __future__ import annotations

import importlib.util
import os
import shutil

CHROMIUM = os.environ.get("CADENCE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CADENCE_CHROMEDRIVER", "/usr/bin/chromedriver")


def why_no_browser() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) or shutil.which(path)):
            return (f"{path} not found: the browser could not be installed here "
                    f"(apt-get install -y {package}; scripts/setup.sh does it where apt exists)")
    return None


def start_chromium(width: int = 1280, height: int = 1150):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-extensions",
                "--no-first-run", f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
