"""Fine-tuning a text classifier from a Hugging Face folder through the recipes: the
folder's model and tokenizer become the run's (config.yaml rebuilds the model without the
folder), its weights are the starting point, and the run predicts, evaluates, draws its
attention and exports like any other."""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tokenizers.implementations import BertWordPieceTokenizer

import attnlab
from attnlab.cli import main
from attnlab.engine.config import ConfigError
from attnlab.formats.hf.load import read_hf
from attnlab.recipes import load_recipe

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

POSITIVE = ["a warm and witty film", "the cast is superb", "a delight from start to end", "moving and funny"]
NEGATIVE = ["a dull and tired mess", "the plot is a bore", "flat jokes and no heart", "tedious from start to end"]


def make_bert_folder(folder, texts, layers=2):
    """A small random BERT with a sequence-classification head and a WordPiece tokenizer of
    ``texts``, saved in ``folder`` as Hugging Face saves a checkpoint."""
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts, vocab_size=120, show_progress=False,
                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    hf_tokenizer = transformers.BertTokenizerFast(tokenizer_object=tok._tokenizer, model_max_length=64)
    config = transformers.BertConfig(vocab_size=hf_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    hf_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return make_bert_folder(tmp_path_factory.mktemp("bert"), POSITIVE + NEGATIVE)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "reviews.csv"
    rows = [(t, "positive") for t in POSITIVE] + [(t, "negative") for t in NEGATIVE]
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows * 4), encoding="utf-8")
    return path


def overrides(reviews, folder, *extra):
    return [f"data.train={reviews}", f"model.checkpoint={folder}", "text.max_length=32", "train.steps=6",
            "train.batch_size=8", "train.warmup_steps=1", "train.eval_every=3", "train.checkpoint_every=3",
            "train.log_every=0", "train.progress=false", "train.tensorboard=false", "train.precision=fp32", *extra]


def test_the_recipe_takes_the_folders_model_and_says_what_is_wrong(bert_folder, reviews, tmp_path, capsys):
    recipe = load_recipe("text-classification-pretrained", overrides(reviews, bert_folder))
    assert recipe.model.name == "bert_base"
    assert recipe.model.options["embed_dim"] == 32 and recipe.model.options["depth"] == 2
    assert main(["train", "text-classification-pretrained", f"data.train={reviews}", "--run-dir",
                 str(tmp_path / "none")]) == 2
    assert "model.name is empty: give model.checkpoint=FOLDER" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    with pytest.raises(ConfigError, match="model.name must be empty or 'bert_base' with model.checkpoint="):
        load_recipe("text-classification-pretrained", overrides(reviews, bert_folder, "model.name=roberta_base"))
    with pytest.raises(ConfigError, match="text.max_length must be at most 64, the positions of model 'bert_base'"):
        load_recipe("text-classification-pretrained", overrides(reviews, bert_folder, "text.max_length=100"))
    without = tmp_path / "no_tokenizer"
    shutil.copytree(bert_folder, without)
    (without / "tokenizer.json").unlink()
    assert main(["train", "text-classification-pretrained", *overrides(reviews, without), "--run-dir",
                 str(tmp_path / "run")]) == 2


def test_fine_tuning_from_the_folder_trains_predicts_and_loads_without_it(bert_folder, reviews, tmp_path, capsys):
    folder = tmp_path / "bert"
    shutil.copytree(bert_folder, folder)
    run_dir = tmp_path / "run"
    assert main(["train", "text-classification-pretrained", *overrides(reviews, folder, "model.freeze_backbone=true"),
                 "--run-dir", str(run_dir)]) == 0
    assert f"initial weights: {folder}" in capsys.readouterr().out
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["name"] == "bert_base" and config["model"]["options"]["num_heads"] == 2
    assert (run_dir / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    # the frozen backbone is the folder's, weight for weight; the head trained
    pretrained = read_hf(folder)[2]
    trained = load_file(next((run_dir / "checkpoints").glob("step_*")) / "model.safetensors")
    for name, value in trained.items():
        if not name.startswith("head."):
            assert torch.equal(value, pretrained[name]), name
    shutil.rmtree(folder)  # the run no longer needs the folder
    run = attnlab.load_run(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert run.evaluate()["test_accuracy"] == results["test_accuracy"]
    [pred] = run.predict(["a witty and moving film"])
    assert pred.label in ("negative", "positive")
    [view] = run.task.attention_views(run, ["a dull film"])
    assert view.tokens[0] == "[CLS]" and len(view.layers) == 2
    pytest.importorskip("onnxruntime", reason="the export extra")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "onnx")]) == 0


def test_lora_run_keeps_adapters_alone_resumes_exactly_and_exports_merged(bert_folder, reviews, tmp_path, capsys):
    """model.lora: the adapters and the head train; checkpoints hold them with the sha256 of
    the folder's weights; a resume is exact; export merges; a changed base is refused."""
    from safetensors.torch import save_file

    from attnlab.engine.checkpoint import checkpoint_base

    folder = tmp_path / "bert"
    shutil.copytree(bert_folder, folder)
    run_dir = tmp_path / "run"
    args = overrides(reviews, folder, "model.lora.rank=4", "model.lora.targets=[attention, mlp]")
    assert main(["train", "text-classification-pretrained", *args, "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "LoRA: " in out and "parameters train" in out
    step = run_dir / "checkpoints" / "step_000000006"
    saved = load_file(step / "model.safetensors")
    assert saved and all(k.endswith(("lora_A", "lora_B")) or k.startswith("head.") for k in saved)
    assert any(k.endswith("q_proj.lora_A") for k in saved) and any(k.endswith("ff.fc1.lora_B") for k in saved)
    base = checkpoint_base(step)
    [(file, digest)] = base["files"].items()
    assert base["source"] == str(folder.resolve()) and file.endswith("model.safetensors") and len(digest) == 64
    # the frozen weights are the folder's; the update is on: the adapters' B left zero
    run = attnlab.load_run(run_dir)
    pretrained = read_hf(folder)[2]
    state = run.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in pretrained.items() if not k.startswith("head."))
    assert any(float(v.abs().max()) > 0 for k, v in saved.items() if k.endswith("lora_B"))
    results = json.loads((run_dir / "results.json").read_text())
    assert run.evaluate()["test_accuracy"] == results["test_accuracy"]

    # exact resume: the run cut after its step-3 checkpoint and resumed ends with the same weights
    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000000006")
    (cut / "results.json").unlink()
    assert main(["train", "text-classification-pretrained", *args, "--run-dir", str(cut), "--resume"]) == 0
    again = load_file(cut / "checkpoints" / "step_000000006" / "model.safetensors")
    assert again.keys() == saved.keys() and all(torch.equal(again[k], saved[k]) for k in saved)

    pytest.importorskip("onnxruntime", reason="the export extra")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "onnx")]) == 0
    difference = float(capsys.readouterr().out.split("against PyTorch on new random inputs: ")[1].split()[0])
    assert difference < 1e-5  # the merged graph against the adapted model

    # the base changed since the run trained: refused, naming the file
    weights = load_file(folder / "model.safetensors")
    save_file({k: v + 1 if k.endswith("query.weight") else v for k, v in weights.items()}, folder / "model.safetensors")
    assert main(["eval", str(run_dir)]) == 2
    assert "has changed (its sha256 differs)" in capsys.readouterr().err
    (folder / "model.safetensors").unlink()
    with pytest.raises(attnlab.errors.InputError, match="model.safetensors is missing since the run trained"):
        attnlab.load_run(run_dir)


def test_mean_pooling_reads_the_real_tokens_and_leaves_the_folders_pooler_out(bert_folder, reviews, tmp_path):
    """model.options.pooler=mean (how sentence-transformers' encoders are read): the mean of the real
    tokens' features, padding or not; fine-tuning from a folder whose dense pooler it does not use."""
    from attnlab.models.encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    model = TextEncoder(TextEncoderConfig(vocab_size=50, num_classes=0, embed_dim=32, depth=1, num_heads=2,
                                          pooler="mean")).eval()
    assert model.pooler is None
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    with torch.no_grad():
        pooled = model(ids, (ids != 0).long())
        alone = model(ids[:1, :3])  # the same text unpadded
    torch.testing.assert_close(pooled[:1], alone, rtol=1e-5, atol=1e-6)
    run_dir = tmp_path / "run"
    assert main(["train", "text-classification-pretrained", *overrides(reviews, bert_folder),
                 "model.options={pooler: mean}", "--run-dir", str(run_dir)]) == 0
    trained = load_file(next((run_dir / "checkpoints").glob("step_*")) / "model.safetensors")
    assert not any(name.startswith("pooler.") for name in trained)
