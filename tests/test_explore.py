"""`minigpt explore`: a local server with one page and one JSON endpoint that runs trace's own
code. Its API refuses bad input with a 400 and keeps serving; a real browser (headless Chromium,
driven by Selenium) types a prompt, clicks a token, moves the attention scale to 0 and sees what
`minigpt trace --json --compare` prints for the same settings."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from minigpt import stages

REPO = Path(__file__).resolve().parents[1]
LESSON_RUN = REPO / "data" / "lesson09"


@pytest.fixture(scope="module")
def server():
    process = subprocess.Popen(
        [sys.executable, "-m", "minigpt", "explore", "--run", str(LESSON_RUN), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, process.stderr.read() if process.poll() is not None else "")
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert process.returncode == 0 and "Traceback" not in stderr, stderr
        assert "minigpt explore: stopped" in stderr


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url + "api/trace", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def cli_compare(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "minigpt", "trace", "--run", str(LESSON_RUN), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_api_answers_what_trace_json_prints(server):
    status, data = post(server, json.dumps({"prompt": "dab", "position": 1, "scale": ["0.attention=0"]}).encode())
    assert status == 200
    assert data == cli_compare("-p", "dab", "--position", "1", "--scale", "0.attention=0", "--compare")
    status, plain = post(server, json.dumps({"ids": "3,0,1"}).encode())
    assert status == 200 and plain == cli_compare("--ids", "3,0,1")
    with urllib.request.urlopen(server + "api/model", timeout=30) as response:
        info = json.loads(response.read())
    assert info["n_embd"] == 4
    # the page names its rows and sliders from the server's stage names (stages.py), in the trace's order
    assert info["stages"] == {
        "input": "input",
        "block": list(stages.block_stages(info["norm_position"])),
        "final": ["final_norm", "logits"],
        "scalable": ["attention", "ffn"],
    }
    assert info["stages"]["block"] == list(plain["blocks"][0]["stages"])
    with urllib.request.urlopen(server, timeout=30) as response:
        assert b"minigpt explore" in response.read()


@pytest.mark.parametrize(
    "body, message",
    [
        (b"not json", "malformed request"),
        (json.dumps({"prompt": "ab", "scale": ["7.attention=0"]}).encode(), "block 7 does not exist"),
        (json.dumps({"prompt": "ab", "ablate_head": ["0.5"]}).encode(), "head 5 does not exist"),
        (json.dumps({"prompt": "ab", "set_input": "1,2"}).encode(), "the model's width is 4"),
        (json.dumps({"prompt": "ab", "position": 9}).encode(), "--position 9 is beyond the prompt"),
        (json.dumps({"prompt": "xyz"}).encode(), "char tokenizer never saw"),
        (json.dumps(["a list"]).encode(), "must be a JSON object"),
    ],
)
def test_bad_requests_get_a_400_with_trace_s_message_and_the_server_keeps_serving(server, body, message):
    status, data = post(server, body)
    assert status == 400 and message in data["error"], data
    assert post(server, json.dumps({"prompt": "ab"}).encode())[0] == 200


def test_a_port_in_use_is_refused_in_one_line(server):
    port = server.rsplit(":", 1)[1].strip("/")
    done = subprocess.run(
        [sys.executable, "-m", "minigpt", "explore", "--run", str(LESSON_RUN), "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"cannot serve on 127.0.0.1:{port}" in done.stderr


def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("headless Chromium and chromedriver are not installed (.ci/run installs them)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1400"):
        options.add_argument(argument)
    options.binary_location = chromium
    return webdriver.Chrome(options=options, service=Service(driver))


def test_in_a_browser_the_attention_slider_shows_what_trace_compare_prints(server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = browser()
    try:
        page.get(server)
        wait = WebDriverWait(page, 30)
        wait.until(lambda p: p.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready")
        prompt = page.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("dab")
        page.find_element(By.ID, "go").click()
        wait.until(lambda p: len(p.find_elements(By.CSS_SELECTOR, "#tokens .chip")) == 3)
        page.find_element(By.CSS_SELECTOR, '#tokens .chip[data-position="1"]').click()
        wait.until(lambda p: p.find_elements(By.CSS_SELECTOR, '#tokens .chip.traced[data-position="1"]'))
        page.execute_script(
            "const s = document.getElementById('scale-attention-0');s.value = 0; s.dispatchEvent(new Event('input'));"
        )
        wait.until(lambda p: p.find_elements(By.ID, "kl"))

        expected = cli_compare("-p", "dab", "--position", "1", "--scale", "0.attention=0", "--compare")
        shown = json.loads(page.find_element(By.ID, "row-after-0-output").get_attribute("data-row"))
        assert shown == expected["after"]["blocks"][0]["stages"]["output"]
        assert (
            json.loads(page.find_element(By.ID, "row-after-0-residual1").get_attribute("data-row"))
            == expected["after"]["input"]["row"]
        )  # attention scale 0: residual1 is the input
        rows = page.find_elements(By.CSS_SELECTOR, "#next-after tr[data-id]")
        assert [(int(r.get_attribute("data-id")), float(r.get_attribute("data-probability"))) for r in rows] == [
            (c["id"], c["probability"]) for c in expected["after"]["next_tokens"]
        ]
        assert float(page.find_element(By.ID, "kl").text) == pytest.approx(expected["kl_divergence"], abs=1e-6)
    finally:
        page.quit()
