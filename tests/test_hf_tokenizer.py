"""Llama-family tokenizers (interchange/hf_tokenizer.py): a folder's tokenizer.json and
tokenizer_config.json read so that minigpt's ids are transformers' AutoTokenizer's, and its text is
transformers' decode, on a multilingual text; the BOS as the folder says, kept through the run
folder's tokenizer.json; streaming decode as `sample` does it; refusals in one line. The tokenizers
are fitted here in each family's shape (scripts/random_hf_folder.py's shaped_tokenizer): nothing is
downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import lazy_module
from hf_folders import random_hf_folder
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from minigpt.errors import MinigptError
from minigpt.interchange.hf_tokenizer import read_folder_tokenizer
from minigpt.sampling.generate import CompletionText
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

transformers = lazy_module("transformers")
shaped_tokenizer = random_hf_folder().shaped_tokenizer  # built by scripts/random_hf_folder.py

REPO = Path(__file__).resolve().parents[1]
# What the tokenizers are fitted to: English with accents and Greek. The text they read adds
# Chinese, Japanese, emoji and Arabic, which a SentencePiece-style tokenizer spells as bytes.
FITTED = REPO.joinpath("data", "tinyshakespeare.txt").read_text(encoding="utf-8")[:20000] + (
    "Café crème brûlée à la française, naïve résumé. Καλημέρα κόσμε, καλή μέρα σας.\n" * 20
)
TEXT = (
    "Hello world! The café’s crème brûlée costs €5.\nΚαλημέρα κόσμε.\n中文测试，你好。\n"
    "日本語のテキスト、こんにちは。\n🙂👍🏽 emoji\nمرحبا بالعالم\n\ttabbed\tline\n\n\n"
    "  two leading spaces\n   three\nnumbers 12345 and 3.14\n  \n end "
)
MODEL_TYPE = {"llama3": "llama", "qwen2": "qwen2", "smollm": "llama", "llama2": "llama", "mistral": "mistral"}
# (shape, bos): None is the family's own choice; the id transformers puts first, or None
VARIANTS = {
    ("llama3", None): "<|begin_of_text|>",
    ("llama3", False): None,
    ("qwen2", None): None,
    ("smollm", None): None,
    ("llama2", None): "<s>",
    ("llama2", False): None,
    ("mistral", None): "<s>",
    ("mistral", False): None,
}


def write_folder(folder: Path, tokenizer_json: str, config: dict | None, model_type: str = "llama") -> Path:
    """A model folder's tokenizer files, and the config.json AutoTokenizer reads the model type from."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """folder(shape, bos) -> a folder of that shape, fitted once per module."""
    made: dict[tuple, Path] = {}

    def make(shape: str, bos: bool | None = None) -> Path:
        if (shape, bos) not in made:
            tokenizer_json, config = shaped_tokenizer(shape, FITTED.splitlines(keepends=True), 600, bos)
            where = tmp_path_factory.mktemp(f"{shape}-{bos}")
            made[shape, bos] = write_folder(where, tokenizer_json, config, MODEL_TYPE[shape])
        return made[shape, bos]

    return make


def theirs(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize(("shape", "bos"), list(VARIANTS), ids=[f"{s}-{b}" for s, b in VARIANTS])
def test_ids_and_text_are_transformers(folder, shape, bos):
    path = folder(shape, bos)
    text, files = read_folder_tokenizer(path)
    hf = theirs(path)
    assert files == "tokenizer.json + tokenizer_config.json"
    ids = text.encode(TEXT)
    assert ids == hf(TEXT)["input_ids"]
    first = VARIANTS[shape, bos]
    assert (ids[0] == text.tok.token_to_id(first)) if first else ids[0] not in text.tok.get_added_tokens_decoder()
    assert text.decode(ids) == hf.decode(ids)
    assert text.decode(text.encode(TEXT, special=False)) == TEXT  # the text alone, exactly
    # any stretch of the ids, cut inside a character's bytes too, is written as transformers writes it
    rng = random.Random(0)
    for _ in range(200):
        a = rng.randrange(len(ids))
        b = rng.randrange(a, len(ids) + 1)
        assert text.decode(ids[a:b]) == hf.decode(ids[a:b]), (a, b)


def test_a_sentencepiece_tokenizer_spells_unknown_characters_as_bytes(folder):
    text, _ = read_folder_tokenizer(folder("llama2"))
    ids = text.encode("中", special=False)  # E4 B8 AD: never seen in fitting
    assert [text.token_text(i) for i in ids] == [" ", "<0xE4>", "<0xB8>", "<0xAD>"]
    assert text.decode(ids) == "中" and text.decode(ids[1:]) == "中"
    the = text.tok.token_to_id("▁the")
    assert text.token_text(the) == " the"  # a piece shows its space
    assert text.decode([the]) == "the" == theirs(folder("llama2")).decode([the])  # the text's first is dropped
    assert text.decode([the, the]) == "the the"


@pytest.mark.parametrize(("shape", "bos"), list(VARIANTS), ids=[f"{s}-{b}" for s, b in VARIANTS])
def test_the_run_folder_tokenizer_json_encodes_the_same(folder, shape, bos, tmp_path):
    """The run folder keeps the tokenizer as tokenizer.json (TextTokenizer.to_str): the BOS rule is
    its post-processor, so the reloaded tokenizer encodes and decodes exactly as the import did."""
    text, _ = read_folder_tokenizer(folder(shape, bos))
    saved = tmp_path / "tokenizer.json"
    saved.write_text(text.to_str(), encoding="utf-8")
    for again in (TextTokenizer.load(saved), TextTokenizer.from_str(text.to_str())):
        assert again.framed and again.encode(TEXT) == text.encode(TEXT)
        assert again.decode(again.encode(TEXT)) == text.decode(text.encode(TEXT))
        assert again.fingerprint() == text.fingerprint()


@pytest.mark.parametrize(("shape", "bos"), [("llama3", None), ("llama2", None), ("llama2", False), ("qwen2", None)])
def test_a_completion_streams_as_the_whole_decodes(folder, shape, bos):
    """`sample` prints the prompt, then the completion one token at a time (CompletionText): the two
    read as transformers' decode of prompt and completion together, wherever the prompt ends."""
    path = folder(shape, bos)
    text, _ = read_folder_tokenizer(path)
    hf = theirs(path)
    ids = text.encode(TEXT)
    for cut in range(2, len(ids), 7):
        prompt = text.decode(ids[:cut])
        if "\ufffd" in prompt:  # the prompt ends inside a character: not a text a user types
            continue
        shown = CompletionText(text)
        streamed = "".join(shown.push(i, 1.0) for i in ids[cut:]) + shown.finish()
        assert prompt + streamed == hf.decode(ids), cut
    # what an untrained model writes: any ids, stray bytes among them (held until their run ends)
    rng = random.Random(1)
    byte_tokens = [i for i in range(text.vocab_size) if text.token_text(i).startswith("<0x")]
    for _ in range(100):
        drawn = [rng.choice(byte_tokens) if byte_tokens and rng.random() < 0.5 else rng.randrange(text.vocab_size)]
        drawn += [rng.randrange(text.vocab_size) for _ in range(rng.randrange(8))]
        shown = CompletionText(text)
        streamed = "".join(shown.push(i, 1.0) for i in drawn) + shown.finish()
        assert text.decode(ids) + streamed == hf.decode(ids + drawn), drawn


def test_a_token_named_by_its_text_is_read_without_the_bos(folder):
    text, _ = read_folder_tokenizer(folder("llama3"))
    bos = text.tok.token_to_id("<|begin_of_text|>")
    the = text.tok.token_to_id("Ġthe")
    assert text.encode(" the") == [bos, the] and text.encode(" the", special=False) == [the]


def test_a_text_that_begins_with_a_space_or_holds_a_special_token_is_read_as_tokenizer_json_says(folder):
    """tokenizers' reading of the file is minigpt's. transformers 5 agrees for every shape but the
    Llama 2 one, which it rebuilds with a Metaspace pre-tokenizer: that one adds no "▁" before a
    text that begins with a space, nor after a special token, where the file's normalizer (as
    transformers 4 and SentencePiece itself) does."""
    texts = ["  leading", " one", "a<s>b", "x </s> y", "<|begin_of_text|>hi", " <|im_start|>user\nHi<|im_end|>"]
    for shape in MODEL_TYPE:
        path = folder(shape)
        text, _ = read_folder_tokenizer(path)
        library, hf = Tokenizer.from_file(str(path / "tokenizer.json")), theirs(path)
        for s in texts:
            assert text.encode(s, special=False) == library.encode(s, add_special_tokens=False).ids
            if shape != "llama2":
                assert text.encode(s) == hf(s)["input_ids"], (shape, s)


def test_special_tokens_the_config_names_are_added_as_transformers_adds_them(folder, tmp_path):
    tokenizer_json = (folder("llama3") / "tokenizer.json").read_text(encoding="utf-8")
    config = json.loads((folder("llama3") / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["additional_special_tokens"] = ["<|custom|>"]
    path = write_folder(tmp_path / "custom", tokenizer_json, config)
    text, _ = read_folder_tokenizer(path)
    ids = text.encode("a<|custom|>b")
    assert ids == theirs(path)("a<|custom|>b")["input_ids"]
    assert text.tok.token_to_id("<|custom|>") in ids and text.decode(ids) == "<|begin_of_text|>a<|custom|>b"


def test_a_unigram_tokenizer_with_a_metaspace_decoder_is_read_exactly(tmp_path):
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator(FITTED.splitlines(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    config = {
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    path = write_folder(tmp_path / "unigram", tok.to_str(), config)
    text, _ = read_folder_tokenizer(path)
    hf = theirs(path)
    for s in (TEXT, "  leading", "a</s>b"):
        ids = text.encode(s)
        assert ids == hf(s)["input_ids"] and ids[-1] == 1
        assert text.decode(ids) == hf.decode(ids) and text.decode(ids[2:]) == hf.decode(ids[2:])


def test_minigpt_s_own_tokenizers_are_not_framed():
    own = TextTokenizer(train_tokenizer("bpe", 300, FITTED))
    assert not own.framed and own.encode(TEXT) == own.encode(TEXT, special=False)
    assert own.encode("a\n\nb") == [i for line in ("a\n", "\n", "b") for i in own.encode(line)]  # line by line


# ---------------------------------------------------------------- refusals


def refusal(path: Path) -> str:
    with pytest.raises(MinigptError) as caught:
        read_folder_tokenizer(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_bos_switch_that_contradicts_the_post_processor_is_refused(folder, tmp_path):
    tokenizer_json = (folder("llama2", False) / "tokenizer.json").read_text(encoding="utf-8")
    config = json.loads((folder("llama2", False) / "tokenizer_config.json").read_text(encoding="utf-8"))
    path = write_folder(tmp_path / "conflict", tokenizer_json, {**config, "add_bos_token": True})
    message = refusal(path)
    assert "add_bos_token = true" in message and "does not put <s> first" in message
    assert "transformers 4" in message


def test_what_cannot_be_read_exactly_is_refused_naming_it(tmp_path):
    assert "has no tokenizer.json" in refusal(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    assert "could not be read as a tokenizer" in refusal(tmp_path)

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.train_from_iterator(
        FITTED.splitlines(), trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"])
    )
    assert "is a WordPiece tokenizer" in refusal(write_folder(tmp_path / "wordpiece", wordpiece.to_str(), None))

    suffixed = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    suffixed.pre_tokenizer = pre_tokenizers.Whitespace()
    suffixed.decoder = decoders.BPEDecoder(suffix="</w>")
    suffixed.train_from_iterator(FITTED.splitlines(), trainers.BpeTrainer(vocab_size=200, end_of_word_suffix="</w>"))
    message = refusal(write_folder(tmp_path / "suffixed", suffixed.to_str(), None))
    assert "BPEDecoder decoder that minigpt cannot follow exactly" in message

    byte_level = Tokenizer.from_str(shaped_tokenizer("smollm", FITTED.splitlines(keepends=True), 300)[0])
    byte_level.post_processor = processors.RobertaProcessing(("</s>", 0), ("<s>", 1))
    assert "RobertaProcessing post-processor" in refusal(write_folder(tmp_path / "roberta", byte_level.to_str(), None))

    byte_level.post_processor = None
    path = write_folder(tmp_path / "split", byte_level.to_str(), {"split_special_tokens": True})
    assert "split_special_tokens = true" in refusal(path)


@pytest.mark.parametrize("shape", list(MODEL_TYPE))
def test_a_shaped_tokenizer_has_exactly_the_ids_asked_for(shape):
    """More ids than the fitting finds merges for: the rest are filler that no text reaches."""
    tokenizer_json, _ = shaped_tokenizer(shape, FITTED.splitlines(keepends=True), 8000)
    text = TextTokenizer(Tokenizer.from_str(tokenizer_json))
    filler = {i for i in range(text.vocab_size) if text.token_text(i).startswith("<filler_")}
    assert text.vocab_size == 8000 and len(filler) > 1000
    assert not filler & set(text.encode(FITTED + TEXT))
