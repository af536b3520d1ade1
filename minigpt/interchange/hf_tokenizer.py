"""The tokenizer of a Llama-family folder (Llama 2 and 3, TinyLlama, Mistral, Qwen2, SmolLM): its
tokenizer.json read by `tokenizers` as it is, with what tokenizer_config.json adds, so that minigpt
encodes a text to the ids transformers' AutoTokenizer gives and decodes ids to the text it writes.

These folders ship two kinds. Byte-level BPE (Llama 3, Qwen2, SmolLM): GPT-2's byte alphabet behind
each family's own pre-tokenizer (a regex, digits one by one, NFC first), special tokens such as
<|begin_of_text|> added, and a template post-processor where a BOS comes first (Llama 3).
SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): a "▁" for every space and one before the
text, unknown characters spelled as bytes (<0xE4>), a decoder that undoes both, and <s> first.

What transformers does besides reading the file, and what is done here:
- special tokens tokenizer_config.json names (bos_token, eos_token, ..., added_tokens_decoder) that
  tokenizer.json does not hold as added tokens are added as special tokens, as transformers adds them;
- BOS and EOS: tokenizer.json's post-processor puts them around a text. transformers 5 reads it
  alone; transformers 4 rebuilt it from add_bos_token / add_eos_token for Llama's tokenizer class.
  Where the two disagree the folder does not say what the model expects, and it is refused;
- padding and truncation saved in the file are turned off, as transformers turns them off unless
  asked;
- clean_up_tokenization_spaces is not applied: transformers 5 skips it for BPE tokenizers (it would
  delete real spaces before punctuation), and minigpt's text is what the ids spell.

The tokenizer is kept as a run's tokenizer.json with a template post-processor even where it adds
no token: the template is what makes TextTokenizer read a text whole and put the BOS first, so a
reloaded run encodes exactly as the import did. Its byte table is checked against the library's
own decoder on every id before it is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from ..errors import MinigptError, Phrase
from ..text.tokenizer import TextTokenizer, post_processors
from .convert import flag_value, literal, read_json, read_tokenizer_file

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"  # older folders: the special tokens' names
# tokenizer_config.json's keys that name one special token each (transformers' SPECIAL_TOKENS_ATTRIBUTES)
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
LISTS = ("additional_special_tokens", "extra_special_tokens")
# post-processors that add no token (ByteLevel: offsets only) or add the template's
POST_PROCESSORS = ("ByteLevel", "TemplateProcessing")


def read_folder_tokenizer(folder: str | Path) -> tuple[TextTokenizer, str]:
    """The tokenizer of a Hugging Face folder of the Llama family and which files it came from:
    tokenizer.json, and tokenizer_config.json (and special_tokens_map.json) where present. What
    cannot be read exactly is refused in one line naming it."""
    folder = Path(folder)
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise MinigptError(
            "{folder} has no tokenizer.json; minigpt reads the tokenizer of a Llama-family folder from "
            "tokenizer.json (a folder with only SentencePiece's tokenizer.model can be completed by loading it "
            "with transformers' AutoTokenizer and saving it with save_pretrained)",
            folder=folder,
        )
    tok = read_tokenizer_file(path)
    where = str(path)
    files = [TOKENIZER_FILE]
    config, config_files = _config(folder)
    files += config_files
    _check_kind(tok, where)
    tok.no_padding()
    tok.no_truncation()
    _add_named_tokens(tok, config, str(folder / CONFIG_FILE))
    _check_ids(tok, where)
    _frame(tok, config, where, str(folder / CONFIG_FILE))
    text = TextTokenizer(tok)
    _check_decoding(text, where)
    return text, " + ".join(files)


# ---------------------------------------------------------------- tokenizer_config.json


def _config(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """tokenizer_config.json ({} without one), with special_tokens_map.json's names where the config
    keeps no added_tokens_decoder (transformers reads that older file only then); and the files read."""
    config, files = {}, []
    if (folder / CONFIG_FILE).is_file():
        config = read_json(folder / CONFIG_FILE)
        files.append(CONFIG_FILE)
    if "added_tokens_decoder" not in config and (folder / SPECIAL_TOKENS_FILE).is_file():
        config = {**config, **read_json(folder / SPECIAL_TOKENS_FILE)}
        files.append(SPECIAL_TOKENS_FILE)
    return config, files


def _content(value: Any, where: str, key: str) -> str | None:
    """A special token as tokenizer_config.json names it: a string, or an AddedToken's dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise MinigptError(
        "{where}: {key} = {literal} is not a token (a string, or an object with a content string)",
        where=where,
        key=key,
        literal=literal(value),
    )


def _add_named_tokens(tok: Tokenizer, config: dict[str, Any], where: str) -> None:
    """Special tokens the config names that tokenizer.json does not hold as added tokens become
    special added tokens (an id they already have is kept), as transformers adds them: a text that
    spells one is then that one id."""
    if config.get("split_special_tokens", False) is not False:
        raise MinigptError(
            "{where}: split_special_tokens = {literal}: transformers then reads special tokens in a text as "
            "plain text, which minigpt does not; only folders with split_special_tokens = false are read",
            where=where,
            literal=literal(config["split_special_tokens"]),
        )
    named: list[str] = []
    for key in NAMED:
        named.append(_content(config.get(key), where, key))
    for key in LISTS:
        values = config.get(key) or []
        values = list(values.values()) if isinstance(values, dict) else values
        named += [_content(value, where, key) for value in (values if isinstance(values, list) else [values])]
    listed = config.get("added_tokens_decoder") or {}
    listed = {
        index: (_content(spec, where, f"added_tokens_decoder.{index}"), spec if isinstance(spec, dict) else {})
        for index, spec in (listed.items() if isinstance(listed, dict) else ())
    }
    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    flags = ("single_word", "lstrip", "rstrip", "normalized", "special")
    tok.add_tokens(
        [
            AddedToken(content, **{k: spec[k] for k in flags if isinstance(spec.get(k), bool)})
            for content, spec in listed.values()
            if content not in have
        ]
    )
    have |= {content for content, _ in listed.values()}
    tok.add_special_tokens(
        [AddedToken(c, special=True, normalized=False) for c in dict.fromkeys(named) if c is not None and c not in have]
    )
    for index, (content, _) in listed.items():
        if str(tok.token_to_id(content)) != str(index):
            raise MinigptError(
                "{where}: added_tokens_decoder gives {token!r} the id {index}, but tokenizer.json gives it "
                "{value}; the two files are not of one tokenizer",
                where=where,
                token=content,
                index=index,
                value=tok.token_to_id(content),
            )


# ---------------------------------------------------------------- the kind of tokenizer


def _check_kind(tok: Tokenizer, where: str) -> None:
    """BPE or Unigram with a decoder the byte table follows; post-processors that add a template's
    tokens or none. Everything else is refused by name."""
    model = type(tok.model).__name__
    if model not in ("BPE", "Unigram"):
        raise MinigptError(
            "{where} is a {model} tokenizer; minigpt reads the Llama family's byte-level BPE (Llama 3, Qwen2, "
            "SmolLM) and SentencePiece-style (Llama 2, Mistral) tokenizers",
            where=where,
            model=model,
        )
    if tok.decoder is None:
        raise MinigptError(
            "{where} has no decoder (its ids would be joined with spaces); minigpt reads tokenizers whose "
            "decoder spells the text (ByteLevel, Metaspace, or Replace + ByteFallback + Fuse + Strip)",
            where=where,
        )
    for part in _template(tok)[1]:
        if part["type"] not in POST_PROCESSORS:
            raise MinigptError(
                "{where} has a {name} post-processor; minigpt reads tokenizers whose post-processor is a "
                "template ({join})",
                where=where,
                name=part["type"],
                join=", ".join(POST_PROCESSORS),
            )


def _check_ids(tok: Tokenizer, where: str) -> None:
    ids = sorted(tok.get_vocab().values())
    if ids != list(range(len(ids))):
        gap = next(i for i, n in enumerate(ids) if i != n)
        raise MinigptError(
            "{where}: the token ids are not 0 .. {last} each once (no token has id {gap}); the tokenizer is damaged",
            where=where,
            last=len(ids) - 1,
            gap=gap,
        )


# ---------------------------------------------------------------- BOS and EOS


def _template(tok: Tokenizer) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The post-processor's TemplateProcessing (None without one) and every part of it."""
    post = tok.post_processor
    parts = post_processors(None if post is None else json.loads(post.__getstate__()))
    return next((p for p in parts if p["type"] == "TemplateProcessing"), None), parts


def _around(template: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """The special tokens a template puts before and after a single text."""
    before, after, seen = [], [], False
    for piece in [] if template is None else template["single"]:
        if "Sequence" in piece:
            seen = True
        else:
            tokens = template["special_tokens"][piece["SpecialToken"]["id"]]["tokens"]
            (after if seen else before).extend(tokens)
    return before, after


def _frame(tok: Tokenizer, config: dict[str, Any], where: str, config_where: str) -> None:
    """Check that tokenizer_config.json's add_bos_token / add_eos_token say what the post-processor
    does, and give a post-processor without a template one that adds nothing (the mark of a model's
    tokenizer, see the module's docstring)."""
    template, parts = _template(tok)
    before, after = _around(template)
    switches = (("add_bos_token", "bos_token", before, "first"), ("add_eos_token", "eos_token", after, "last"))
    for key, name, ends, end in switches:
        if key not in config:
            continue
        adds = flag_value(config_where, key, config[key])
        token = _content(config.get(name), config_where, name)
        if token is None:
            continue  # transformers turns the switch off without a token to add
        if adds != (token in ends):
            raise MinigptError(
                "{config_where} says {key} = {literal}, but {where}'s post-processor {does} put {token} {end}; "
                "transformers 4 follows the first and transformers 5 the second, so the folder does not say "
                "which the model was trained with: make the two agree (without {key}, tokenizer.json decides)",
                config_where=config_where,
                key=key,
                literal=literal(adds),
                where=where,
                does="does not" if adds else "does",
                token=token,
                end=end,
            )
    if template is None:
        bare = processors.TemplateProcessing(single="$A", pair="$A $B")
        tok.post_processor = processors.Sequence([tok.post_processor, bare]) if parts else bare


# ---------------------------------------------------------------- decoding


def _check_decoding(text: TextTokenizer, where: str) -> None:
    """The byte table against the library's own decoder: every id alone, then every id in a row (byte
    tokens run together, the first token's space). A decoder it does not follow is refused."""
    tok = text.tok
    size = tok.get_vocab_size()
    alone = tok.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    wrong = next((i for i in range(size) if text.decode([i]) != alone[i]), None)
    every = list(range(size))
    if wrong is None and text.decode(every) == tok.decode(every, skip_special_tokens=False):
        return
    decoder = json.loads(tok.decoder.__getstate__())
    steps = decoder.get("decoders", [decoder]) if decoder["type"] == "Sequence" else [decoder]
    shown = " + ".join(step["type"] for step in steps)
    if wrong is None:
        detail = Phrase("its tokens decode differently in a row")
    else:
        ours = text.decode([wrong])
        detail = Phrase(
            "token {token} decodes to {theirs!r}, not {ours!r}", token=wrong, theirs=alone[wrong], ours=ours
        )
    raise MinigptError(
        "{where} has a {shown} decoder that minigpt cannot follow exactly ({detail}); it follows ByteLevel, "
        "Metaspace, and Replace + ByteFallback + Fuse + Strip",
        where=where,
        shown=shown,
        detail=detail,
    )
