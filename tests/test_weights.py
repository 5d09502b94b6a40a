"""`fedcli weights`: the registry matches the published URLs (torchvision's; torch-fidelity's for FID's
Inception), status reads the hub cache, fetch downloads only through a stubbed network here and keeps
nothing it could not verify."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from email.message import Message
from pathlib import Path

import pytest
import torch
import torchvision.models
from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

from fedcli.core import weights


class FakeResponse:
    """What torch.hub's downloader reads from urlopen: headers and a byte stream."""

    def __init__(self, data: bytes):
        self.stream, self.headers = io.BytesIO(data), Message()
        self.headers["Content-Length"] = str(len(data))

    def info(self):
        return self.headers

    def read(self, n: int = -1) -> bytes:
        return self.stream.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def network(monkeypatch, tmp_path):
    """A hub cache under tmp_path and a network that serves `network.files[url]` and records requests;
    any other URL fails as an offline machine does."""

    class Network:
        files: dict[str, bytes] = {}
        requests: list[str] = []

    def urlopen(request):
        Network.requests.append(request.full_url)
        if request.full_url not in Network.files:
            raise OSError("no network in tests")
        return FakeResponse(Network.files[request.full_url])

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    monkeypatch.setattr(torch.hub, "urlopen", urlopen)
    assert weights.hub_dir() == tmp_path / "torch" / "hub" / "checkpoints"
    return Network


def state_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"features.0.weight": torch.ones(2, 3)}, buffer)
    return buffer.getvalue()


def fake_backbone(monkeypatch, data: bytes, name: str = "alex") -> weights.Backbone:
    """Backbone `name` renamed to a file whose name carries `data`'s sha256 prefix, as published names do."""
    prefix = hashlib.sha256(data).hexdigest()[:8]
    backbone = dataclasses.replace(weights.BACKBONES[name], filename=f"{name}-fake-{prefix}.pth")
    monkeypatch.setitem(weights.BACKBONES, name, backbone)
    return backbone


def test_every_file_name_is_its_published_urls_and_carries_a_hash_prefix():
    for backbone in weights.BACKBONES.values():
        assert Path(weights.url(backbone)).name == backbone.filename
        assert len(weights.expected_prefix(backbone.filename)) >= 6
    assert weights.url(weights.BACKBONES["inception"]) == URL_INCEPTION_V3  # the TF-ported one, not torchvision's


def test_status_tells_absent_present_and_corrupt_files_apart(cli, network, monkeypatch):
    data = state_bytes()
    backbone = fake_backbone(monkeypatch, data)
    assert weights.state_of(backbone) == "absent"
    weights.hub_dir().mkdir(parents=True)
    (weights.hub_dir() / backbone.filename).write_bytes(data)
    assert weights.state_of(backbone) == "present"
    (weights.hub_dir() / backbone.filename).write_bytes(data + b"tampered")
    assert weights.state_of(backbone) == "corrupt"
    output = cli.ok("weights", "status").output
    assert "corrupt" in output and "alex-random" not in output and "vgg-random" in output
    assert network.requests == []


def test_fetch_downloads_torchvisions_url_into_the_hub_cache_once(cli, network, monkeypatch):
    data = state_bytes()
    backbone = fake_backbone(monkeypatch, data)
    url = torchvision.models.AlexNet_Weights.IMAGENET1K_V1.url
    network.files[url] = data
    assert "downloaded" in cli.ok("weights", "fetch", "alex").output
    assert (weights.hub_dir() / backbone.filename).read_bytes() == data
    assert weights.state_of(backbone) == "present"
    assert "already present" in cli.ok("weights", "fetch", "alex").output
    assert network.requests == [url]


def test_fetch_inception_downloads_torch_fidelitys_file_where_fid_looks(cli, network, monkeypatch):
    data = state_bytes()
    backbone = fake_backbone(monkeypatch, data, "inception")
    network.files[URL_INCEPTION_V3] = data
    assert "downloaded" in cli.ok("weights", "fetch", "inception").output
    assert network.requests == [URL_INCEPTION_V3]
    assert weights.hub_checkpoint(weights.BACKBONES["inception"].filename).read_bytes() == data
    assert weights.state_of(backbone) == "present"


def test_fetch_keeps_nothing_it_could_not_verify(cli, network, monkeypatch):
    backbone = fake_backbone(monkeypatch, state_bytes())
    network.files[torchvision.models.AlexNet_Weights.IMAGENET1K_V1.url] = state_bytes() + b"x"
    assert "could not fetch alex" in cli.user_error("weights", "fetch", "alex")
    evil = io.BytesIO()
    torch.save({"w": torch.ones(1), "code": print}, evil)  # loadable only by running pickled code
    backbone = fake_backbone(monkeypatch, evil.getvalue())
    network.files[torchvision.models.AlexNet_Weights.IMAGENET1K_V1.url] = evil.getvalue()
    assert "not loadable without running pickled code" in cli.user_error("weights", "fetch", "alex")
    assert not weights.hub_dir().exists() or list(weights.hub_dir().iterdir()) == []
    assert weights.state_of(backbone) == "absent"


def test_fetch_offline_unknown_names_and_corrupt_files_are_one_line(cli, network, monkeypatch):
    assert "check the connection" in cli.user_error("weights", "fetch", "vgg")
    assert "choose from vgg, alex, inception" in cli.user_error("weights", "fetch", "resnet1")
    backbone = fake_backbone(monkeypatch, state_bytes())
    weights.hub_dir().mkdir(parents=True, exist_ok=True)
    (weights.hub_dir() / backbone.filename).write_bytes(b"junk")
    assert "delete it" in cli.user_error("weights", "fetch", "alex")
    assert (weights.hub_dir() / backbone.filename).read_bytes() == b"junk"
