"""Headless Chromium through Selenium with the system's browser and chromedriver (Debian: apt-get install chromium
chromium-driver); nothing is downloaded. A helper module, not a test file."""

from __future__ import annotations

import shutil

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)


def chrome():
  """A headless Chrome WebDriver, or a pytest skip naming what is missing."""
  try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
  except ImportError:
    pytest.skip("selenium is not installed (pip install -e '.[test]')")
  browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
  driver = next((shutil.which(d) for d in DRIVERS if shutil.which(d)), None)
  if browser is None or driver is None:
    pytest.skip("no system Chromium / chromedriver (apt-get install -y chromium chromium-driver)")
  options = webdriver.ChromeOptions()
  options.binary_location = browser
  for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
    options.add_argument(arg)
  return webdriver.Chrome(service=Service(driver), options=options)
