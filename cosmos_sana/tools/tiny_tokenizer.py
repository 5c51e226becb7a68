"""A Gemma-style fast tokenizer trained offline on a small built-in word list."""

from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")

#: The training corpus: prompt-like English words, digits and punctuation.
_WORDS = """
a an the of in on at to with and or under over above below behind beside between near far inside outside
left right top bottom front back center middle corner edge side up down into onto through across along
one two three four five six seven eight nine ten zero many few some several single pair group crowd
red orange yellow green blue purple pink brown black white gray grey gold silver cyan magenta beige
dark light bright pale vivid soft warm cool colorful glowing shiny matte transparent clear foggy misty
cat dog bird horse cow sheep fish lion tiger bear elephant giraffe zebra monkey rabbit fox wolf deer
man woman child boy girl person people baby friend family teacher doctor chef artist robot astronaut
car bus truck train plane boat ship bicycle motorcycle rocket road street bridge city town village
house building tower castle church room kitchen window door wall floor roof table chair bed sofa lamp
tree flower grass leaf forest garden park field mountain hill river lake sea ocean beach island desert
sky cloud sun moon star rain snow storm wind fire water ice stone rock sand wood metal glass paper
apple banana orange cake bread pizza coffee tea cup bottle plate bowl spoon fork knife vase book clock
sign text word letter logo poster banner label menu card note says reading written saying quote title
photo photograph painting drawing sketch illustration render portrait landscape closeup wide shot view
style realistic cartoon anime watercolor oil digital cinematic detailed sharp blurry high quality
morning noon evening night sunset sunrise dusk dawn summer winter spring autumn day shadow reflection
big small large tiny huge long short tall round square flat old new young happy sad calm busy quiet
is are was be has have holding sitting standing walking running flying swimming eating looking playing
camera motion score slow fast smooth steady pan zoom scene frame video moving turning falling rising
""".split()


def _corpus() -> list[str]:
    lines = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 12)]
    lines += [w.capitalize() for w in _WORDS]
    lines += ["0 1 2 3 4 5 6 7 8 9 10 20 30 50 100 . , ! ? : ; ' \" - ( )"]
    return lines


def build_tokenizer(vocab_size: int = 512) -> Any:
    """A ``GemmaTokenizerFast``: byte-level BPE, ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3; prepends ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    return GemmaTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="right",
        model_max_length=300,
    )
