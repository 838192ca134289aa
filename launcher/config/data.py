"""Which dataset to train on (and validate on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from launcher.config.checks import require_positive
from launcher.config.records import CONCAT, Packing, TrainOn, packing_value
from launcher.config.sources import check_sources, names_many, path_list
from launcher.errors import ConfigError

HELD_OUT_PROBLEMS = 256
"""data.eval_problems=null: the problems held out (reverse, jsonl)."""
UNCACHED_EVAL_PROBLEMS = 32
"""data.eval_problems=null: the problems scored for a model decoded without a KV cache."""


class DataKind(str, Enum):
    reverse = "reverse"
    text = "text"
    jsonl = "jsonl"
    tokens = "tokens"
    hf = "hf"
    custom = "custom"


class TokenDtype(str, Enum):
    uint16 = "uint16"
    uint32 = "uint32"


class DataOrder(str, Enum):
    feistel = "feistel"
    randperm = "randperm"


@dataclass
class SourceConfig:
    """One source of a `data.sources` mixture: its own files, mixed in by weight."""

    name: str = ""
    """Names the source's metrics (tokens/NAME) and its entries in the data identity."""
    weight: float = 0.0
    """Its share of every global batch's samples (the weights are normalised to sum to 1)."""
    path: Any = None
    """Its files: one path, a glob or a list (as data.path)."""
    dtype: TokenDtype | None = None
    """tokens: this source's dtype (default data.dtype)."""
    text_field: str | None = None
    """hf: this source's document field (default data.text_field)."""


NEEDS_PATH = {
    DataKind.text: "a UTF-8 text file",
    DataKind.jsonl: "a JSON Lines file",
    DataKind.tokens: "a flat binary token file (.bin)",
    DataKind.hf: "a parquet, json/jsonl, arrow or csv file, or a saved dataset directory",
}


@dataclass
class DataConfig:
    """`reverse` is built in (no file); `text`, `jsonl`, `tokens` and `hf` read data.path;
    `custom` builds any map-style dataset named by data._target_."""

    name: DataKind = DataKind.reverse
    """reverse | text | jsonl | tokens (flat binary token file) | hf (datasets + tokenizer) |
    custom."""
    path: Any = None
    """The training data (text, jsonl, tokens, hf; ignored by reverse and custom). tokens: also a
    list or a glob of shards, one corpus (data.path='shards/*.bin', data.path=[a.bin,b.bin])."""
    sources: list[SourceConfig] = field(default_factory=list)
    """tokens, hf: a weighted mixture instead of data.path, e.g.
    [{name:web,path:web/*.bin,weight:0.75},{name:code,path:code.bin,weight:0.25}]."""
    order: DataOrder = DataOrder.feistel
    """The sample order: feistel (computed, O(1) memory) or randperm (the order of runs before
    orders were recorded, torch.randperm per epoch: kept to resume their checkpoints)."""
    val_path: Any = None
    """tokens, hf, text: held-out data for the validation loss (eval.every), same format as path
    (tokens: a list or glob too)."""
    dtype: TokenDtype = TokenDtype.uint16
    """tokens: uint16 (vocabularies up to 65,536, nanoGPT's format) or uint32."""
    tokenizer: str | None = None
    """hf: a local tokenizer directory (tokenizer.json, or anything AutoTokenizer loads)."""
    text_field: str = "text"
    """hf pretraining: the field holding each document (concatenated with EOS and packed)."""
    prompt_field: str | None = None
    """hf fine-tuning: the prompt field (its tokens are masked with -100); set with
    completion_field."""
    completion_field: str | None = None
    """hf fine-tuning: the completion field (the tokens that are trained on)."""
    messages_field: str | None = None
    """hf fine-tuning on conversations: the field holding each record's list of
    {"role", "content"} messages, rendered with the chat template (docs/data.md)."""
    chat_template: str | None = None
    """hf conversations: a Jinja chat template (its text, or a file holding it); default the
    tokenizer's own (tokenizer_config.json's chat_template, or chat_template.jinja)."""
    train_on: TrainOn = TrainOn.assistant
    """hf conversations: assistant (each assistant turn and its end-of-turn marker are targets,
    the rest -100) | all (every token after the first)."""
    packing: Packing = False
    """hf: false (fine-tuning: one record per padded sequence; pretraining: documents
    concatenated and cut) | true (records placed whole into windows of seq_len, best-fit
    decreasing, each with its own positions and attention) | concat (records concatenated and
    cut into full windows)."""
    cross_document_attention: bool = False
    """hf, concatenated windows (pretraining, data.packing=concat): true lets a token attend to
    the earlier documents of its window with positions running on (the behaviour before
    document masks); false (default) gives each document its own positions and attention."""
    split: str = "train"
    """hf: the split of a saved DatasetDict (or of a dataset directory) to read."""
    eos_token: str | None = None
    """hf: the end-of-sequence token; default the tokenizer's own (or </s>, <|endoftext|>,
    <eos>)."""
    cache_dir: str | None = None
    """hf: where tokenized data is cached (default $LAUNCHER_CACHE, else $LAUNCHER_CACHE_DIR/data,
    else ~/.cache/launcher/data)."""
    tokenize_workers: int | None = None
    """hf: processes that tokenize into the cache (null: the available cores; 1: this process
    alone). The cache is the same whatever the number."""
    holdout: int = 0
    """text, tokens, hf, custom without val_path: the last N samples are held out for validation."""
    _target_: str | None = None
    """custom: pkg.mod.callable returning a map-style dataset of {"input_ids", "labels"}."""
    args: dict[str, Any] = field(default_factory=dict)
    """custom: keyword arguments for data._target_ (+data.args.NAME=VALUE on the command line)."""
    min_len: int = 2
    """reverse: shortest string to reverse."""
    max_len: int = 8
    """reverse: longest string to reverse."""
    alphabet: str = "abcdefghij"
    """reverse: the characters of the strings."""
    eval_problems: int | None = None
    """Held-out problems scored by exact match of greedy decoding at the end (reverse, jsonl).
    null: 256 held out, all scored for a model decoded with a KV cache (the built-in GPT,
    transformers), the first 32 for any other (each new token reruns the whole sequence); never
    more than the run trained on (train.steps x batch.global_size sequences)."""

    def __post_init__(self) -> None:
        # Built in code (tests, a user's script) the enums may come as their strings.
        self.name, self.order = DataKind(self.name), DataOrder(self.order)
        self.dtype, self.train_on = TokenDtype(self.dtype), TrainOn(self.train_on)
        self.packing = packing_value(self.packing)
        require_positive("data.min_len", self.min_len)
        require_positive("data.max_len", self.max_len)
        require_positive("data.eval_problems", self.eval_problems, allow_none=True)
        if self.tokenize_workers is not None and self.tokenize_workers < 1:
            raise ConfigError(
                "data.tokenize_workers",
                f"must be 1 or more, got {self.tokenize_workers}.",
                "set data.tokenize_workers=1 (this process only), a number of processes, or "
                "null (the available cores).",
            )
        if self.holdout < 0:
            raise ConfigError("data.holdout", f"must be 0 or more, got {self.holdout}.")
        if self.max_len < self.min_len:
            raise ConfigError(
                ["data.min_len", "data.max_len"], "max_len is below min_len.", "raise data.max_len."
            )
        check_sources(self.name.value, self.sources, self.path, self.holdout)
        self._check_paths()
        if self.name == DataKind.hf and not self.tokenizer:
            raise ConfigError(
                "data.tokenizer",
                "data=hf needs a tokenizer.",
                "add data.tokenizer=DIR (a local directory with tokenizer.json).",
            )
        if (self.prompt_field is None) != (self.completion_field is None):
            raise ConfigError(
                ["data.prompt_field", "data.completion_field"],
                "fine-tuning needs both fields.",
                "set both (e.g. data.prompt_field=prompt data.completion_field=completion), "
                "or neither for pretraining on data.text_field.",
            )
        if self.name == DataKind.custom and not self._target_:
            raise ConfigError(
                "data._target_",
                "data=custom needs the callable that builds the dataset.",
                "add data._target_=my_project.data.make_dataset.",
            )
        if self.name != DataKind.custom and (self._target_ or self.args):
            key = "data._target_" if self._target_ else "data.args"
            raise ConfigError(
                key, f"only applies to data=custom (data is {self.name.value}).", "add data=custom."
            )
        self._check_records()
        if not self.alphabet or any(ord(c) > 127 or c in "|." for c in self.alphabet):
            raise ConfigError(
                "data.alphabet",
                "must be ASCII characters other than '|' and '.'.",
            )

    def _check_paths(self) -> None:
        if self.sources:
            if self.order != DataOrder.feistel:
                raise ConfigError(
                    "data.order",
                    "a data.sources mixture draws each source's order with data.order=feistel.",
                    "drop data.order=randperm.",
                )
        elif self.name in NEEDS_PATH and not self.path:
            raise ConfigError(
                "data.path",
                f"data={self.name.value} needs a file.",
                f"add data.path=/path/to/file ({NEEDS_PATH[self.name]}).",
            )
        for key, value in (("data.path", self.path), ("data.val_path", self.val_path)):
            if value is None:
                continue
            path_list(key, value)
            if names_many(value) and self.name != DataKind.tokens:
                raise ConfigError(
                    key,
                    f"a list or glob of files is a data=tokens corpus; data={self.name.value} "
                    "reads one file.",
                    "give one file, or mix several with data.sources=[{name:a,path:a.jsonl,"
                    "weight:0.5},...] (data=hf).",
                )

    @property
    def tuning(self) -> bool:
        """Fine-tuning records (prompt/completion pairs or conversations), not documents."""
        return self.prompt_field is not None or self.messages_field is not None

    @property
    def document_masks(self) -> bool:
        """Sequences hold several documents, each with its own positions and attention."""
        if self.name != DataKind.hf:
            return False
        if self.packing is True:
            return True
        concat = self.packing == CONCAT or not self.tuning
        return concat and not self.cross_document_attention

    def _check_records(self) -> None:
        """Conversations, packing and their switches: data=hf only, and consistent."""
        hf_only = {
            "data.messages_field": self.messages_field is not None,
            "data.chat_template": self.chat_template is not None,
            "data.packing": self.packing is not False,
            "data.cross_document_attention": self.cross_document_attention,
        }
        for key, given in hf_only.items():
            if given and self.name != DataKind.hf:
                raise ConfigError(
                    key,
                    f"only applies to data=hf (data is {self.name.value}).",
                    f"add data=hf, or drop {key}.",
                )
        if self.messages_field is not None and self.prompt_field is not None:
            raise ConfigError(
                ["data.messages_field", "data.prompt_field"],
                "a record is either a conversation or a prompt/completion pair.",
                "drop data.prompt_field and data.completion_field, or data.messages_field.",
            )
        if self.messages_field is None:
            for key, wrong in (
                ("data.chat_template", self.chat_template is not None),
                ("data.train_on", self.train_on != TrainOn.assistant),
            ):
                if wrong:
                    raise ConfigError(
                        key,
                        "only applies to conversations.",
                        "add data.messages_field=messages (the conversations' field), "
                        f"or drop {key}.",
                    )
        if self.cross_document_attention and self.tuning and self.packing != CONCAT:
            raise ConfigError(
                "data.cross_document_attention",
                "only applies to concatenated windows (pretraining, or data.packing=concat).",
                "add data.packing=concat, or drop data.cross_document_attention.",
            )

    @property
    def held_out_problems(self) -> int:
        """The problems held out for the exact-match evaluation (and reverse's val_loss)."""
        return self.eval_problems or HELD_OUT_PROBLEMS

    def scored_problems(self, cached: bool, trained: int | None = None) -> int:
        """How many held-out problems the end-of-training evaluation decodes: data.eval_problems,
        else all of them, or UNCACHED_EVAL_PROBLEMS without a KV cache (cached=False), and never
        more than `trained`, the sequences the run trained on (train.steps x batch.global_size):
        a short run's evaluation costs in proportion to the run."""
        if self.eval_problems is not None:
            return self.eval_problems
        bound = HELD_OUT_PROBLEMS if cached else UNCACHED_EVAL_PROBLEMS
        return bound if trained is None else max(1, min(bound, trained))
