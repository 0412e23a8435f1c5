"""Every subpackage is installed, and the fixtures are shipped as package data."""

import tomllib

from conftest import REPO


def test_every_subpackage_is_listed_in_pyproject():
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for p in (REPO / "paramsurgery").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {found - listed}"
    assert conf["package-dir"]["paramsurgery.fixtures"] == "fixtures"


def test_fixtures_resolve():
    from paramsurgery.core.resources import fixture

    assert fixture("ncnn_corpus/squeezenet_v1.1.param").is_file()
