import subprocess
import sys

import pytest

from rewards.result import VerifyResult
from rlvr_env.testing import build_char_tokenizer


def test_verify_result_rejects_unknown_status():
    assert float(VerifyResult(1.0)) == 1.0
    with pytest.raises(ValueError, match="status"):
        VerifyResult(0.0, status="wrong")


def test_char_tokenizer_round_trips_text():
    tok = build_char_tokenizer()
    text = "12 + 34 = \\boxed{46}\n"
    assert tok.decode(tok(text).input_ids) == text
    assert tok.eos_token_id is not None and tok.pad_token_id is not None


def test_rlvr_rejects_unknown_command():
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown command 'frobnicate'" in proc.stderr
