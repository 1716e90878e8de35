"""`slicex peer add|list|remove` and `slicex ca export-root` (cli/peers.py): slicex.yaml written as `slicex up`
reads it, the operator's other lines kept, mistakes refused with exit 2 before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cli.main import main
from cli.peers import set_block
from slicex import pki
from slicex.home import Home
from slicex.peers import load_peers


def homes(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["--home", str(a), "ca", "init", "--authority", "a.test"]) == 0
    assert main(["--home", str(b), "ca", "init", "--authority", "b.test"]) == 0
    return a, b


def test_export_add_list_remove(tmp_path: Path, capsys) -> None:
    a, b = homes(tmp_path)
    root = tmp_path / "a-root.pem"
    assert main(["--home", str(a), "ca", "export-root", "--out", str(root)]) == 0
    assert pki.cert_urn(root.read_bytes()) == "urn:publicid:IDN+a.test+authority+ca"
    config = b / "slicex.yaml"
    config.write_text(config.read_text() + "# operator's note\n")
    assert main(["--home", str(b), "peer", "add", "testbed-a", "--root", str(root), "--sliver-type", "m1.small",
                 "--max-lease-hours", "2", "--max-cores", "4", "--ch-url", "https://127.0.0.1:1/CH"]) == 0
    text = config.read_text()
    assert "# operator's note" in text and "authority: b.test" in text
    peers = load_peers(Home(b).config().peers, "b.test", b)
    assert [(p.name, p.namespaces, p.ch_url) for p in peers] == [("testbed-a", ("a.test",), "https://127.0.0.1:1/CH")]
    assert peers[0].policy.sliver_types == ("m1.small",) and peers[0].policy.max_cores == 4
    assert (b / "peers" / "testbed-a.pem").read_bytes() == root.read_bytes()
    capsys.readouterr()
    assert main(["--home", str(b), "peer", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["name"] == "testbed-a" and listed[0]["root_urns"] == ["urn:publicid:IDN+a.test+authority+ca"]
    assert main(["--home", str(b), "peer", "add", "testbed-a", "--root", str(root)]) == 2  # exists
    assert main(["--home", str(b), "peer", "remove", "testbed-a"]) == 0
    assert load_peers(Home(b).config().peers, "b.test", b) == [] and "# operator's note" in config.read_text()


def test_mistakes_write_nothing(tmp_path: Path, capsys) -> None:
    a, b = homes(tmp_path)
    root = tmp_path / "a-root.pem"
    main(["--home", str(a), "ca", "export-root", "--out", str(root)])
    before = (b / "slicex.yaml").read_text()
    assert main(["--home", str(b), "peer", "add", "evil", "--root", str(root), "--namespace", "b.test"]) == 2
    assert "overlaps this deployment's own namespace b.test" in capsys.readouterr().err
    assert main(["--home", str(b), "peer", "add", "x", "--root", str(root), "--max-slivers", "-1"]) == 2
    assert main(["--home", str(b), "peer", "add", "x", "--root", str(b / "slicex.yaml")]) == 2  # not PEM
    assert (b / "slicex.yaml").read_text() == before
    assert not (b / "peers").exists() or not any((b / "peers").iterdir())  # no root copied, nothing staged left


def test_set_block_replaces_only_its_block() -> None:
    text = "authority: b.test\npeers:\n  old:\n    root: x\n\n  other:\n    root: y\n# kept\nam_port: 1\n"
    out = set_block(text, "peers", {"new": {"root": "z"}})
    assert yaml.safe_load(out) == {"authority": "b.test", "peers": {"new": {"root": "z"}}, "am_port": 1}
    assert "# kept" in out
    assert yaml.safe_load(set_block(out, "peers", {})) == {"authority": "b.test", "am_port": 1}
    assert yaml.safe_load(set_block("a: 1\n", "peers", {"p": {"root": "r"}})) == {"a": 1, "peers": {"p": {"root": "r"}}}
