from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
CORPUS = FIXTURES / "ncnn_corpus"


def corpus_params() -> list[Path]:
    return sorted(CORPUS.glob("*.param"))


@pytest.fixture
def tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def ncnn_loads(text: str) -> int:
    """ncnn's own verdict on a text param (0 = accepted)."""
    import ncnn

    net = ncnn.Net()
    return net.load_param_mem(text)
