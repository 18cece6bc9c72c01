"""`selfspec serve` / `python -m selfspec.serve`: one real server process (answers as `generate` does, the API key from
the environment, a clean exit on Ctrl-C), and mistakes as one line with exit status 2."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from selfspec import cli
from selfspec.engine import SelfSpecModel
from tests.selfspec.tiny_text import save_model_dir

MESSAGES = [{"role": "user", "content": "Café au lait?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("serve") / "model", seed=2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_server_process_answers_and_stops_cleanly_on_ctrl_c(model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SELFSPEC_API_KEY": "k3y", "SELFSPEC_CACHE_DIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "selfspec.serve", model_dir, "--port", str(port), "--threads", "1",
         "--model-name", "tiny", "--num-draft-tokens", "3", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the server never became ready"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES}).status_code == 401
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k3y", max_retries=0, timeout=60)
        answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
        reference = SelfSpecModel.from_pretrained(model_dir, drafter="ngram")
        assert answer.choices[0].message.content == reference.generate(MESSAGES, max_new_tokens=12).text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130  # a shell's status for Ctrl-C, after the graceful shutdown
        assert "Traceback" not in process.communicate(timeout=30)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_mistakes_are_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path / "missing")]) == 2
    assert cli.main(["serve", str(tmp_path), "--port", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("selfspec: error:") for line in err)


def test_a_model_that_cannot_load_exits_with_one_line(tmp_path, capsys):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    assert cli.main(["serve", str(empty), "--port", str(free_port()), "--log-level", "critical"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("selfspec: error:"), err
