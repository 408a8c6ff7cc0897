#!/usr/bin/env python3
"""Regenerates the tokenizer test data in this folder from the reference code.

    python3 make_tokenizer_data.py CLIP_CHECKOUT FTFY_CHECKOUT VOCAB_JSON

CLIP_CHECKOUT: github.com/openai/CLIP at d05afc43 (clip/simple_tokenizer.py and
its bpe_simple_vocab_16e6.txt.gz); FTFY_CHECKOUT: github.com/rspeer/python-ftfy
at 74dd0452 (6.3.1); needs the `regex` and `wcwidth` packages.

Writes clip_words.tsv (id, word: whole words that are one token) and
tokenizer_extra_cases.jsonl (prompt, BPE ids) with HF CLIPTokenizer's clean-up
(ftfy.fix_text, whitespace, lower case; no html.unescape), the semantics SD uses.
"""
import json
import os
import random
import sys

clip_dir, ftfy_dir, vocab_path = sys.argv[1:4]
sys.path.insert(0, ftfy_dir)
sys.path.insert(0, os.path.join(clip_dir, "clip"))
import ftfy  # noqa: E402
import regex  # noqa: E402
import simple_tokenizer  # noqa: E402

tok = simple_tokenizer.SimpleTokenizer(os.path.join(clip_dir, "clip", "bpe_simple_vocab_16e6.txt.gz"))
here = os.path.dirname(os.path.abspath(__file__))


def bpe_ids(text):
    text = simple_tokenizer.whitespace_clean(ftfy.fix_text(text)).lower()
    ids = []
    for word in regex.findall(tok.pat, text):
        word = "".join(tok.byte_encoder[b] for b in word.encode("utf-8"))
        ids.extend(tok.encoder[t] for t in tok.bpe(word).split(" "))
    return ids


# Words: vocabulary entries "xyz</w>" made of letters only that encode to
# their own single id (all non-ASCII ones, every 4th ASCII one).
vocab = json.load(open(vocab_path, encoding="utf-8"))
words = []
for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
    if not token.endswith("</w>"):
        continue
    try:
        word = bytes(tok.byte_decoder[c] for c in token[:-4]).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        continue
    if not regex.fullmatch(r"\p{L}+", word) or (word.isascii() and i % 4):
        continue
    if bpe_ids(word) == [i]:
        words.append((i, word))
with open(os.path.join(here, "clip_words.tsv"), "w", encoding="utf-8") as f:
    for i, word in words:
        f.write(f"{i}\t{word}\n")

# Extra prompts: mojibake in several code pages, HTML entities, controls,
# contractions and special-token spellings, random Unicode.
random.seed(20240601)
samples = ["café", "naïve", "über", "Zürich", "crème brûlée", "señor", "façade", "ångström", "smørrebrød",
           "niño", "Ελληνικά", "русский", "日本語", "😀", "🐱", "✔", "“quoted”", "don’t", "…", "—", "€5", "£",
           "©", "™", "½", "°C", "São Paulo", "Łódź", "İstanbul", "ß", "œuvre", "Æsir", "ﬁre", "ﬂow", "ＡＢＣ",
           "ｶﾀｶﾅ", "à la mode", "déjà vu", "x²", "±", "×", "→", "•", "‘single’"]
encodings = ["latin-1", "cp1252", "cp1251", "cp1250", "cp1253", "cp1254", "cp1257", "iso-8859-2", "mac-roman",
             "cp437"]
extra_chars = [chr(c) for c in list(range(0x20, 0x7F)) + list(range(0x80, 0x100)) + [
    0x152, 0x153, 0x160, 0x161, 0x178, 0x17D, 0x17E, 0x192, 0x2C6, 0x2DC, 0x2013, 0x2014, 0x2018, 0x2019,
    0x201A, 0x201C, 0x201D, 0x201E, 0x2020, 0x2021, 0x2022, 0x2026, 0x2030, 0x2039, 0x203A, 0x20AC, 0x2122,
    0x391, 0x3B2, 0x3C0, 0x412, 0x413, 0x420, 0x421, 0x432, 0x402, 0x45E, 0x2550, 0x2502, 0x221A, 0x2248,
    0xFFFD, 0x345, 0x17F, 0x212A, 0x130, 0x3A3, 0xFB01, 0xFF21, 0x3000, 0x1B, 0x7, 0xB, 0xC, 0xD, 0xA, 0x85,
    0x2028, 0xFEFF, 0x200D, 0x1F431]]
entities = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&nbsp;", "&eacute;", "&EACUTE;", "&SZLIG;", "&hellip;",
            "&mdash;", "&rsquo;", "&copy;", "&AMP;", "&Cap;", "&#39;", "&#x1F431;", "&#128;", "&#0;", "&#12a;",
            "&amp", "&#x110000;", "&#65;", "&notanentity;", "&#59;", "&#x3B;", "&#13;", "&#xFFFE;"]
misc = ["\x1b[31m", "\x1b[0m", "\r\n", "\r", "\n", "  ", "\t", "<b>", "</b>", "'s", "'S", "'ſ", "<|endoftext|>",
        "<|STARTOFTEXT|>", "'ll", "'RE", "'d've"]


def mojibake(word):
    text = word.encode("utf-8").decode(random.choice(encodings), errors="replace")
    return text.replace("\xa0", " ") if random.random() < 0.3 else text


def piece():
    r = random.random()
    if r < 0.3:
        return mojibake(random.choice(samples))
    if r < 0.45:
        return random.choice(samples)
    if r < 0.6:
        return random.choice(entities)
    if r < 0.72:
        return random.choice(misc)
    return "".join(random.choice(extra_chars) for _ in range(random.randint(1, 5)))


prompts = []
for _ in range(600):
    prompts.append("".join(piece() + (" " if random.random() < 0.5 else "") for _ in range(random.randint(1, 5))))
with open(os.path.join(here, "tokenizer_extra_cases.jsonl"), "w", encoding="utf-8") as f:
    for p in prompts:
        fixed = ftfy.fix_text(p)
        f.write(json.dumps({"prompt": p, "fixed": fixed != p, "ids": bpe_ids(p)}, ensure_ascii=True) + "\n")
print(len(words), "words,", len(prompts), "prompts")
