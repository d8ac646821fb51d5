"""No data loss: deploy never replaces what is not its own package, archives never
extract outside their folder. Every case uses real files and the real CLI (its
``main()`` in this process, one refusal also as its own process)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from helpers import assert_one_error_line, cli_here, run_cli
from test_bad_input import mx, small_net, small_params

from edgecv.board.errors import PackageError
from edgecv.board.package import FORMAT, archive, unpack_if_archive


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A small symbol file with its params beside it (deploys in seconds)."""
    prefix = tmp_path_factory.mktemp("src") / "tiny"
    small_net().save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {k: mx.nd.array(v) for k, v in small_params().items()})
    return f"{prefix}-symbol.json"


@pytest.fixture(scope="module")
def pool_model(tmp_path_factory):
    """A graph without parameters (no params file at all)."""
    path = tmp_path_factory.mktemp("pool") / "pool-symbol.json"
    d = mx.sym.var("data")
    mx.sym.Pooling(d, kernel=(2, 2), stride=(2, 2), pool_type="max").save(str(path))
    return str(path)


def deploy_args(tiny_model, out, *extra):
    """A deploy without the graph tuner (what these tests read does not depend on it)."""
    return ["deploy", tiny_model, "--input-shape", "1,2,5,5", "--layout", "NCHW", "-o", out, *extra]


def test_refuses_a_folder_that_is_not_a_package(tiny_model, tmp_path, capfd):
    folder = tmp_path / "Documents"
    folder.mkdir()
    (folder / "thesis.txt").write_text("five years of work")
    (folder / "manifest.json").write_text('{"not": "ours"}')  # a manifest, not an edgecv one
    for extra in ([], ["--force"]):
        result = cli_here(capfd, *deploy_args(tiny_model, folder, *extra))
        line = assert_one_error_line(result, str(folder))
        assert "not an edgecv package" in line
    assert (folder / "thesis.txt").read_text() == "five years of work"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "thesis.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".Documents")]


def test_refuses_a_file(tiny_model, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    result = run_cli(*deploy_args(tiny_model, target, "--force"))
    assert_one_error_line(result, str(target))
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("command", ["deploy", "tune"])
def test_a_database_folder_that_is_not_one_is_refused(tiny_model, tmp_path, command, capfd):
    """`--db` takes the tuning records and the graph tuner's costs: a file, or a folder
    of the user's own, is refused before anything is measured, and left as it was."""
    documents = tmp_path / "Documents"
    documents.mkdir()
    (documents / "thesis.txt").write_text("five years of work")
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    for db, why in ((documents, "not an edgecv tuning database"), (notes, "is a file")):
        args = ["--input-shape", "1,2,5,5", "--db", str(db)]
        if command == "deploy":
            args += ["-o", str(tmp_path / "pkg")]
        else:
            args += ["--device", "cpu", "--trials", "1"]
        result = cli_here(capfd, command, tiny_model, *args)
        assert why in assert_one_error_line(result, str(db))
    assert sorted(p.name for p in documents.iterdir()) == ["thesis.txt"]
    assert (documents / "thesis.txt").read_text() == "five years of work"
    assert notes.read_text() == "keep me"
    assert not (tmp_path / "pkg").exists()


def test_replacing_a_package_takes_force(tiny_model, pool_model, tmp_path, capfd):
    out = tmp_path / "pkg"
    assert cli_here(capfd, *deploy_args(tiny_model, out)).returncode == 0
    first = json.loads((out / "manifest.json").read_text())
    assert first["format"] == FORMAT
    (out / "marker").write_text("from the first deploy")

    refused = cli_here(capfd, *deploy_args(tiny_model, out))
    assert_one_error_line(refused, "--force")
    assert (out / "marker").is_file()  # untouched

    replaced = cli_here(
        capfd, "deploy", pool_model, "--input-shape", "1,3,8,8", "-o", out, "--force"
    )
    assert replaced.returncode == 0, replaced.stderr
    second = json.loads((out / "manifest.json").read_text())
    assert (first["model"]["name"], second["model"]["name"]) == ("tiny", "pool")
    assert not (out / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no leftovers


def test_archive_never_overwrites_a_foreign_file(tiny_model, tmp_path, capfd):
    out = tmp_path / "pkg"
    assert cli_here(capfd, *deploy_args(tiny_model, out)).returncode == 0
    foreign = tmp_path / "pkg.tar.gz"
    foreign.write_bytes(b"someone's backup")
    with pytest.raises(PackageError, match="not an edgecv package archive"):
        archive(out, force=True)
    assert foreign.read_bytes() == b"someone's backup"
    foreign.unlink()
    archive(out)
    with pytest.raises(PackageError, match="--force"):
        archive(out)
    assert archive(out, force=True) == foreign


def _evil_archive(path, members):
    """A .tar.gz with the given (TarInfo, bytes) members plus a valid-looking manifest."""
    manifest = json.dumps({"format": FORMAT}).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{path.name.removesuffix('.tar.gz')}/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)


def _file(name):
    return tarfile.TarInfo(name)


def _link(name, target, hard=False):
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (lambda tmp: (_file(str(tmp / "abs.txt")), b"x"), "absolute path"),
        (lambda tmp: (_file("pkg/../escaped.txt"), b"x"), "`..`"),
        (lambda tmp: (_file("sibling/planted.txt"), b"x"), "outside the package folder"),
        (lambda tmp: (_link("pkg/up", "../victim.txt"), b""), "`pkg/up` is a link"),
        (lambda tmp: (_link("pkg/abs", "/etc/passwd"), b""), "`pkg/abs` is a link"),
        (lambda tmp: (_link("pkg/hard", "victim.txt", hard=True), b""), "`pkg/hard` is a link"),
        # deploy never writes a link: one pointing inside is refused as well
        (lambda tmp: (_link("pkg/in", "manifest.json"), b""), "`pkg/in` is a link"),
        (lambda tmp: (_link("pkg/in", "pkg/manifest.json", hard=True), b""), "`pkg/in` is a link"),
    ],
)
def test_archive_members_outside_the_package_are_refused(tmp_path, member, why, capfd):
    victim = tmp_path / "victim.txt"
    victim.write_text("safe")
    path = tmp_path / "pkg.tar.gz"
    _evil_archive(path, [member(tmp_path)])
    with pytest.raises(PackageError, match=why):
        unpack_if_archive(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg.tar.gz", "victim.txt"]
    assert victim.read_text() == "safe"
    result = cli_here(capfd, "run", path, "--input", tmp_path / "x.npy")
    assert_one_error_line(result, "not a safe package archive")


@pytest.mark.parametrize("data_filter", [True, False], ids=["data filter", "no data filter"])
def test_a_chain_of_links_cannot_write_outside(tmp_path, monkeypatch, data_filter):
    """Each link of the chain points inside the package as written, together they lead
    out of it: `pkg/d` -> `.`, `pkg/e` -> `d/d/../..` (the staging folder's parent),
    then a file `pkg/e/victim.txt`. Refused at the first link, before anything is
    extracted, also on Pythons whose tarfile has no `data` filter (3.9's early releases,
    which the device runtime supports)."""
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("safe")
    path = tmp_path / "pkg.tar.gz"
    links = [(_link("pkg/d", "."), b""), (_link("pkg/e", "d/d/../.."), b"")]
    _evil_archive(path, [*links, (_file("pkg/e/victim.txt"), b"overwritten")])
    with pytest.raises(PackageError, match="member `pkg/d` is a link"):
        unpack_if_archive(path)
    assert victim.read_text() == "safe"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg.tar.gz", "victim.txt"]


def test_archive_does_not_overwrite_an_existing_folder(tiny_model, tmp_path, capfd):
    out = tmp_path / "pkg"
    assert cli_here(capfd, *deploy_args(tiny_model, out, "--archive")).returncode == 0
    packed = tmp_path / "pkg.tar.gz"
    # The folder beside it is the same package: it is used as is.
    assert unpack_if_archive(packed) == out
    # A folder of the same name holding something else is never overwritten.
    for child in out.iterdir():
        child.unlink() if child.is_file() else None
    (out / "mine.txt").write_text("user data")
    with pytest.raises(PackageError, match="will not overwrite"):
        unpack_if_archive(packed)
    assert (out / "mine.txt").read_text() == "user data"
