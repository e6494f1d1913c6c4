"""What ``d2l-transformer evaluate --model`` prints: the text of an `evaluate.evaluate_model`
report (its scores, their signatures, the overlaps with training, examples)."""

from ..data import WordTokenizer
from ..evaluate import format_score


def format_report(report):
    """The text ``d2l-transformer evaluate --model`` prints for an `evaluate_model` report."""
    words = WordTokenizer()
    lines = [report["engine_choice"]] if report.get("engine_choice") else []
    if report["chapter_sentences"]:
        lines.append("the chapter's sentences, per-sentence BLEU (d2l's bleu, k=2, on d2l's "
                     "lower-cased tokens):")
    for c in report["chapter_sentences"]:
        shown = c["source"] if report["tokenizer"] == "subword" else " ".join(words.encode(c["source"]))
        lines.append(f"  [{c['decoder']}] {shown} => {c['translation']}, bleu {c['d2l_bleu']:.3f}")
    if report.get("note"):
        lines.append(report["note"])
    if report.get("capped"):
        lines.append(f"scored the first {report['capped']:,} pairs of each held-out set "
                     "(--max-sentences 0 scores all)")
    lines.append(f"corpus BLEU and chrF (the {report['engine']} engine's translations; sacreBLEU, "
                 "detokenized output against the untokenized references"
                 + (", case-insensitive" if report["lowercase"] else "") + "):")
    signatures = {}
    for entry in report["sets"]:
        seen = _seen(entry)
        if not entry["scored"]:
            lines.append(f"  {entry['name']}: no pairs{seen}")
            continue
        cells, multi_cells, refused = [], [], 0
        for decoder, result in entry["decoders"].items():
            signatures = {"BLEU": result["bleu_signature"], "chrF": result["chrf_signature"]}
            cells.append(f"{decoder}: {format_score(result)} ({result['seconds']:.0f} s)")
            refused = result.get("untranslatable", 0)
            if "all_references" in result:
                signatures["all references' BLEU"] = result["all_references"]["bleu_signature"]
                multi_cells.append(f"{decoder}: {format_score(result['all_references'])}")
        lines.append(f"  {entry['name']} ({entry['scored']} of {entry['pairs']}): "
                     + "  ".join(cells) + seen)
        if refused:
            lines.append(f"    {refused} of its sources are longer than the model's positions: "
                         "scored as empty translations")
        unseen = entry.get("unseen")
        if unseen:
            lines.append(f"    its {unseen['pairs']} pairs unseen on both sides: " + "  ".join(
                f"{d}: {format_score(r)}" for d, r in unseen["decoders"].items()))
        if multi_cells:
            multi = result["all_references"]
            lines.append(f"    each of its {multi['sentences']} sources once, against all its "
                         f"references (1 to {multi['most_references']}): " + "  ".join(multi_cells))
        for ex in entry.get("examples", []):
            lines.append(f"    {ex['source']} => {ex['translation']}   "
                         f"[reference: {ex['reference']}]")
    for metric, signature in signatures.items():
        lines.append(f"{metric} signature: {signature}")
    return "\n".join(lines)


def _seen(entry):
    """``  [seen in training: 0 sources, 184 references]``, or nothing where not counted."""
    sources, references = entry.get("sources_seen_in_training"), entry.get(
        "references_seen_in_training")
    if sources is None:
        return ""
    return f"  [seen in training: {sources} sources, {references} references as targets]"
