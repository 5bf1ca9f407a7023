"""Every sentence ragexp writes for people in Chinese and English, in one table: the report,
the Markdown summaries of ``gate`` and ``diff``, and the tables they share.

A key names one meaning; where two outputs word the same meaning alike they share the key
(``metric``, ``delta``), where the wording differs the key says how (``higher`` reads "higher is
better" in a sentence, ``better_higher`` "higher" under a "Better" header).
"""

from __future__ import annotations

LANGUAGES = ("zh", "en")
"""Languages of every phrase: ``--language`` and ``report.language`` take these."""


def check_language(language: str | None) -> None:
    """Refuse a ``--language`` no phrase is written in."""
    if language is not None and language not in LANGUAGES:
        from ragexp.errors import ConfigError

        raise ConfigError(f"--language: expected {' or '.join(LANGUAGES)}, got {language!r}")


LANGUAGE_SETTING = "RAGEXP_LANGUAGE"
"""The user's language (``zh`` or ``en``), read by every command: the default of ``--language``
and, through ``conf/config.yaml``, of ``report.language`` (the language a run writes its
rationales in)."""


def user_language(language: str | None) -> str | None:
    """``--language`` when given, else the user's setting (``$RAGEXP_LANGUAGE``), else None (the
    run's own ``report.language``); either is refused, naming it, unless a language phrases exist in."""
    import os

    check_language(language)
    if language is not None:
        return language
    setting = os.environ.get(LANGUAGE_SETTING) or None
    if setting is not None and setting not in LANGUAGES:
        from ragexp.errors import ConfigError

        raise ConfigError(f"${LANGUAGE_SETTING}: expected {' or '.join(LANGUAGES)}, got {setting!r}")
    return setting


PHRASES: dict[str, dict[str, str]] = {
    # The report.
    "title": {"zh": "RAG 评测报告", "en": "RAG evaluation report"},
    # The sweep report (report --sweep).
    "sweep_title": {"zh": "参数扫描报告", "en": "Sweep report"},
    "sweep_points": {"zh": "各扫描点与基线的比较", "en": "The points against the baseline"},
    "sweep_family": {
        "zh": "差值为相对基线 {baseline} 的配对差值；{tests} 个比较（扫描点 × 指标）的区间按 Bonferroni 同时成立于 "
        "{confidence}（每个 {level}）；* 表示经 Holm 校正后显著。",
        "en": "Differences are paired, from the baseline {baseline}; the intervals of the {tests} comparisons "
        "(points x metrics) hold together at {confidence} (Bonferroni, each at {level}); * significant after "
        "Holm's adjustment.",
    },
    "sweep_front": {"zh": "帕累托前沿", "en": "The Pareto front"},
    "sweep_front_over": {"zh": "前沿维度：{axes}；前沿上的点：{front}。", "en": "Over {axes}; on the front: {front}."},
    "sweep_status_front": {"zh": "在前沿上", "en": "on the front"},
    "sweep_status_dominated": {"zh": "以置信度被支配", "en": "dominated (with confidence)"},
    "sweep_status_indistinguishable": {"zh": "与前沿无法区分", "en": "not distinguishable from the front"},
    "sweep_recommendation": {"zh": "推荐", "en": "Recommendation"},
    "sweep_point": {"zh": "扫描点", "en": "point"},
    "sweep_overrides": {"zh": "覆盖项", "en": "overrides"},
    "sweep_errored": {"zh": "出错", "en": "errored"},
    "sweep_pareto": {"zh": "帕累托", "en": "pareto"},
    "identity": {"zh": "运行身份", "en": "Identity"},
    "official": {
        "zh": "官方定义：指标的定义与出处",
        "en": "Official: what the metrics are, and who defines them",
    },
    "self_defined": {
        "zh": "本项目自定：指标、合格线、数据集与基线",
        "en": "Self-defined: metrics, pass marks, dataset and baseline",
    },
    "project_metrics": {"zh": "本项目定义的指标", "en": "Metrics this project defines"},
    "project_choices": {"zh": "本项目的判断依据", "en": "What this project chose"},
    "honesty": {
        "zh": "本报告中合格线（门禁阈值）与评估数据集均为本项目自定，官方未给出任何阈值，也不提供考题。"
        "评估数据集共 {n} 条，由 {author} 编写，只能证明系统在这些题目上的表现，"
        "不能证明在客户真实问题分布上的表现。",
        "en": "The pass marks (gate thresholds) and the evaluation dataset in this report are self-defined by this "
        "project: no official source gives thresholds or test questions. The dataset has {n} cases written by "
        "{author}; it shows how the system does on these questions, not on the distribution of a customer's "
        "real questions.",
    },
    "honesty_project": {
        "zh": "指标 {names} 由本项目定义。",
        "en": "The metrics {names} are defined by this project.",
    },
    "honesty_official": {
        "zh": "指标 {names} 的定义与取值范围来自 ragas / MindSDK 评估模块，但其分数依赖所用判官模型。",
        "en": "The definitions and ranges of {names} come from ragas / the MindSDK evaluation module, but their "
        "scores depend on the judge model used.",
    },
    "metric": {"zh": "指标", "en": "Metric"},
    "definition": {"zh": "定义", "en": "Definition"},
    "range": {"zh": "取值范围", "en": "Range"},
    "direction": {"zh": "方向", "en": "Direction"},
    "fields": {"zh": "所需字段", "en": "Required fields"},
    "source": {"zh": "出处", "en": "Source"},
    "higher": {"zh": "越高越好", "en": "higher is better"},
    "lower": {"zh": "越低越好", "en": "lower is better"},
    "project": {"zh": "本项目定义", "en": "defined by this project"},
    "yours": {"zh": "由你定义", "en": "defined by you"},
    "yours_note": {
        "zh": "标为“由你定义”的指标（{names}）是你们团队在 metrics.custom 中自定的规则或评分标准：非官方，"
        "其定义、取值范围与方向以你们的配置为准，本报告只按该定义计算。",
        "en": 'The metrics marked "defined by you" ({names}) are your team\'s own rules or rubrics, as your '
        "config's metrics.custom states them: not official; their definition, range and direction are yours, and "
        "this report only computes them as defined.",
    },
    "item": {"zh": "项", "en": "Item"},
    "value": {"zh": "取值", "en": "Value"},
    "who": {"zh": "谁定的", "en": "Set by"},
    "self": {"zh": "自定", "en": "self-defined"},
    "cases": {"zh": "条", "en": "cases"},
    "thresholds": {"zh": "合格线（门禁规则）", "en": "Pass marks (gate rules)"},
    "none": {"zh": "无", "en": "none"},
    "results": {"zh": "结果与分布", "en": "Results and distributions"},
    "mean": {"zh": "均值", "en": "Mean"},
    "scored": {"zh": "有分数的样本", "en": "Scored cases"},
    "errors_list": {"zh": "出错样本清单", "en": "Errored cases"},
    "histogram": {"zh": "逐条分数分布", "en": "Per-case score distribution"},
    "question": {"zh": "问题", "en": "Question"},
    "answer": {"zh": "回答", "en": "Answer"},
    "retrieved": {"zh": "召回的 id", "en": "Retrieved ids"},
    "comparison": {"zh": "与基线对比", "en": "Comparison with the baseline"},
    "delta": {"zh": "差值", "en": "Delta"},
    "updown": {"zh": "变好/变差/不变", "en": "Up/down/same"},
    "compared": {"zh": "比较的样本", "en": "Cases compared"},
    "run_figure": {"zh": "整次运行", "en": "run"},
    "versions_ledger": {
        "zh": "数据集版本不同（--common-cases）：新增 {added}、删除 {removed}、修改 {changed}、未变 {unchanged}；"
        "只比较两个版本都未改动的 {unchanged} 条样本",
        "en": "Dataset versions differ (--common-cases): {added} added, {removed} removed, {changed} changed, "
        "{unchanged} unchanged; compared on the {unchanged} cases both versions hold unchanged",
    },
    "scatter": {"zh": "逐条对比（基线 vs 候选）", "en": "Per case: baseline vs candidate"},
    "gate": {"zh": "发布门禁", "en": "Release gate"},
    "rule": {"zh": "规则", "en": "Rule"},
    "why": {"zh": "原因", "en": "Why"},
    "threshold": {"zh": "阈值", "en": "Threshold"},
    "candidate": {"zh": "候选", "en": "Candidate"},
    "no_diagnosis": {
        "zh": "指标的变化不符合决策表的任何一行。",
        "en": "The metric moves match no row of the decision table.",
    },
    "spread": {"zh": "判官重复评分的波动", "en": "Spread between judge repeats"},
    "run": {"zh": "运行", "en": "Run"},
    "config_hash": {"zh": "配置哈希", "en": "Config hash"},
    "dataset_hash": {"zh": "数据集哈希", "en": "Dataset hash"},
    "provider": {"zh": "被测系统", "en": "Provider"},
    "judge": {"zh": "判官身份", "en": "Judge identity"},
    "version": {"zh": "ragexp 版本", "en": "ragexp version"},
    "date": {"zh": "运行时间", "en": "Run date"},
    "k": {"zh": "K", "en": "K"},
    "author": {"zh": "作者", "en": "Author"},
    "not_proved": {"zh": "本次运行没有证明什么", "en": "What this run does not prove"},
    "trust": {"zh": "判官可信度：与人工评分对照", "en": "How far the judge can be trusted: against human scores"},
    "trust_automatic": {"zh": "自动评分与人工评分对照", "en": "Automatic scores against human scores"},
    "trust_intro": {
        "zh": "数据集中有人工评分（human 字段）的样本用来校准自动评分：MAE 为平均绝对误差，偏差为自动分减人工分的均值"
        "（正数表示判官偏宽松），Spearman 为排序一致性，准确率与 Cohen's κ 比较以 {threshold} 为界的通过/不通过判断。"
        "PPI 均值是预测驱动推断：全部样本的自动分均值，用有标注样本上的人工−自动差值修正，区间同时计入两部分方差；"
        "前提是有标注的样本是随机抽取的。",
        "en": "Cases with human scores (the dataset's human field) calibrate the automatic scores: MAE is the mean "
        "absolute error, bias the mean automatic minus human score (positive: the judge is more generous), Spearman "
        "the rank agreement, accuracy and Cohen's κ the agreement on pass/fail at {threshold}. The PPI mean is the "
        "prediction-powered estimate: the automatic mean over every case corrected by the mean human - automatic "
        "difference on the labelled ones, its interval counting both variances; it assumes the labelled cases were "
        "drawn at random.",
    },
    "no_labels": {
        "zh": "没有指标达到校准所需的人工评分数量：判官分数未经校准，只能作参考。",
        "en": "No metric has enough human scores for calibration: the judge scores are uncalibrated.",
    },
    "ppi_title": {"zh": "预测驱动推断（PPI）均值", "en": "Prediction-powered means"},
    "judge_vs_human": {"zh": "自动分与人工分", "en": "Automatic vs human score"},
    "audit": {"zh": "标注审计", "en": "Label audit"},
    "audit_none": {"zh": "标注审计未发现问题。", "en": "The label audit found nothing."},
    "audit_count": {
        "zh": "标注审计发现 {n} 处疑点，请回看原文：",
        "en": "The label audit found {n} labels to look at:",
    },
    "baseline_run": {"zh": "对比基线", "en": "Baseline"},
    "eval_dataset": {"zh": "评估数据集", "en": "Evaluation dataset"},
    "errored_cases": {"zh": "出错样本（已排除）", "en": "Errored cases (excluded)"},
    "verdict": {"zh": "结论", "en": "Verdict"},
    "by_turn": {"zh": "按轮次位置（两次运行都有分数的轮次）", "en": "By turn position (turns both runs scored)"},
    "turn": {"zh": "轮次", "en": "Turn"},
    "pairs": {"zh": "配对数", "en": "Pairs"},
    "by_stratum": {
        "zh": "按分层（影子对：裁判的差值，及按人工标注做预测驱动校正后的差值）",
        "en": "By stratum (shadow pair: the judged delta, and the delta corrected by people's labels)",
    },
    "stratum": {"zh": "分层", "en": "Stratum"},
    "judged_delta": {"zh": "裁判差值", "en": "Judged delta"},
    "labelled_pairs": {"zh": "已标注配对", "en": "Labelled pairs"},
    "ppi_delta": {"zh": "PPI 差值", "en": "PPI delta"},
    "ppi_interval": {"zh": "PPI 区间", "en": "PPI interval"},
    "verdict_failed": {"zh": "未通过", "en": "FAILED"},
    "verdict_passed": {"zh": "通过", "en": "PASSED"},
    "worst_cases": {"zh": "最差样本", "en": "Worst cases"},
    # The report's first section: what changed against the baseline (ragexp.compare.changes).
    "what_changed": {"zh": "变化了什么", "en": "What changed"},
    "what_changed_intro": {
        "zh": "相对基线 {baseline}：{worse} 条样本至少有一项指标变差，{better} 条至少有一项变好。"
        "每项指标下列出的样本数，就是对比表中该指标的变差与变好条数。",
        "en": "Against the baseline {baseline}: {worse} cases got worse and {better} got better on at least one "
        "metric. For each metric, the cases listed are the comparison table's down and up counts.",
    },
    "none_changed": {"zh": "没有样本在任何逐条指标上发生变化。", "en": "No case moved on any per-case metric."},
    "cases_worse": {"zh": "变差的样本", "en": "Cases worse"},
    "cases_better": {"zh": "变好的样本", "en": "Cases better"},
    "got_worse": {"zh": "变差的样本（{n} 条）", "en": "Cases that got worse ({n})"},
    "got_better": {"zh": "变好的样本（{n} 条）", "en": "Cases that got better ({n})"},
    "moved_on": {"zh": "变化的指标", "en": "Moved on"},
    "baseline_retrieved": {"zh": "基线召回", "en": "Baseline retrieved"},
    "baseline_answer": {"zh": "基线回答", "en": "Baseline answer"},
    "candidate_retrieved": {"zh": "候选召回", "en": "Candidate retrieved"},
    "candidate_answer": {"zh": "候选回答", "en": "Candidate answer"},
    "now_errors": {"zh": "新出错", "en": "now errors"},
    "no_longer_errors": {"zh": "不再出错", "en": "no longer errors"},
    "reasons_recorded": {
        "zh": "{runs} 的理由按运行时记录的原文显示：这些运行早于可按阅读者语言重写理由的版本。",
        "en": "The rationales of {runs} are shown as recorded, in the run's language: those runs were made "
        "before rationales could be rewritten in the reader's language.",
    },
    "more_cases": {
        "zh": "另有 {n} 条未列出（两次运行的 cases.jsonl 含全部样本）。",
        "en": "{n} more not listed (both runs' cases.jsonl hold every case).",
    },
    # The report's gate section.
    "gate_ran": {
        "zh": "这是对这组运行实际执行过的门禁（ragexp gate，记录在候选运行的 {path}）。",
        "en": "The gate that ran on this pair (ragexp gate, recorded on the candidate run as {path}).",
    },
    "gate_not_ran": {
        "zh": "这组运行没有执行过门禁（候选运行的 {path} 没有记录）；"
        "此处按候选运行配置的规则集 {gates}（{n} 条规则）判定。",
        "en": "No gate ran on this pair (nothing recorded on the candidate run as {path}); applied here: the "
        "candidate's configured rule set {gates} ({n} rules).",
    },
    "gate_verdict": {
        "zh": "{gates}：{word}（{n} 条规则中 {failed} 条未通过）",
        "en": "{gates}: {word} ({failed} of {n} rules did not pass)",
    },
    "passed": {"en": "passed", "zh": "通过"},
    # A trace's response preview, as a reviewer reads it on MLflow's Review page (case_traces.py).
    "review_no_answer": {"en": "no answer", "zh": "没有回答"},
    "review_expected": {"en": "Expected", "zh": "期望"},
    "review_refusal": {"en": "a refusal (the case is unanswerable)", "zh": "拒答（不可回答的问题）"},
    "review_facts": {"en": "Expected facts", "zh": "期望事实"},
    "review_reference": {"en": "Reference answer", "zh": "参考答案"},
    "review_contexts": {"en": "Retrieved contexts ({n})", "zh": "召回的上下文（{n} 条）"},
    # The rule that scores an unanswerable case on a metric averaged over the answerable cases.
    "unanswerable_row": {
        "en": (
            "unanswerable case: scored on its own row by the article's rule (an empty ranking 1.0, any ranking "
            "0.0); the run's mean covers the answerable cases only"
        ),
        "zh": (
            "不可回答的问题：按文章规则单独计分（未召回任何结果记 1.0，召回了结果记 0.0）；运行的均值只覆盖可回答的问题"
        ),
    },
    # Why each per-hop score is what it is (ragexp.metrics.hops).
    "hop_no_call": {
        "en": "hop {hop}: the system made {calls} retrieval calls, none for this hop",
        "zh": "第 {hop} 跳：系统只发起了 {calls} 次检索调用，没有这一跳的",
    },
    "hop_recall": {
        "en": "hop {hop} (query {query}): {found} of {gold} gold items in the top {k}",
        "zh": "第 {hop} 跳（查询 {query}）：前 {k} 个结果命中 {found}/{gold} 条标注证据",
    },
    "hop_rank": {
        "en": "hop {hop} (query {query}): first gold item at rank {rank}",
        "zh": "第 {hop} 跳（查询 {query}）：第一个标注证据在第 {rank} 位",
    },
    "hop_rank_none": {
        "en": "hop {hop} (query {query}): no gold item among its {n} results",
        "zh": "第 {hop} 跳（查询 {query}）：{n} 个结果中没有标注证据",
    },
    "hop_evidence": {
        "en": "hop {hop} (query {query}): {found} of {gold} gold items anywhere in its {n} results",
        "zh": "第 {hop} 跳（查询 {query}）：全部 {n} 个结果中命中 {found}/{gold} 条标注证据",
    },
    "hop_first_failing": {
        "en": "hop {hop} is the first whose gold is not all in its top {k} ({found} of {gold}; query {query})",
        "zh": "第 {hop} 跳是第一个标注证据未全部进入前 {k} 的跳（{found}/{gold}；查询 {query}）",
    },
    "hop_none_failing": {
        "en": "every hop's gold is in its top {k} ({hops} hops)",
        "zh": "每一跳的标注证据都在前 {k} 内（共 {hops} 跳）",
    },
    "hop_calls": {
        "en": "{calls} retrieval calls, {redundant} redundant",
        "zh": "{calls} 次检索调用，其中 {redundant} 次冗余",
    },
    "hop_unreported": {
        "en": "the reply reported no retrieval calls (response.retrievals): hops cannot be scored",
        "zh": "回复未报告检索调用（response.retrievals）：无法按跳评分",
    },
    # Why each offline score is what it is: a case's rationale per metric (ragexp.metrics.reasons).
    "reason_more": {"en": " and {n} more", "zh": " 等另 {n} 项"},
    "reason_retrieved_nothing": {"en": "retrieved nothing", "zh": "未召回任何结果"},
    "reason_retrieved_some": {"en": "retrieved {n} items", "zh": "召回了 {n} 条结果"},
    "reason_recall": {
        "en": "{found} of {n} relevant ids in the top {k}",
        "zh": "前 {k} 个结果命中 {n} 个相关 id 中的 {found} 个",
    },
    "reason_found": {"en": "found: {items}", "zh": "命中：{items}"},
    "reason_missed": {"en": "missed: {items}", "zh": "未命中：{items}"},
    "reason_not_retrieved": {"en": "not retrieved", "zh": "未召回"},
    "reason_below_k": {"en": "at rank {rank}, below the top {k}", "zh": "排在第 {rank} 位，在前 {k} 之外"},
    "reason_spans": {
        "en": "{found} of {n} evidence spans covered in the top {k}",
        "zh": "前 {k} 个结果覆盖了 {n} 段证据中的 {found} 段",
    },
    "reason_doc_spans": {"en": "{doc} {covered} of {n}", "zh": "{doc} {n} 段中 {covered} 段"},
    "reason_covered": {"en": "covered: {items}", "zh": "已覆盖：{items}"},
    "reason_not_covered": {"en": "not covered: {items}", "zh": "未覆盖：{items}"},
    "reason_first": {"en": "first relevant id {item} at rank {rank}", "zh": "第一个相关 id {item} 排在第 {rank} 位"},
    "reason_first_chunk": {
        "en": "first chunk matching the evidence at rank {rank}",
        "zh": "第一个匹配证据的片段排在第 {rank} 位",
    },
    "reason_no_relevant": {
        "en": "no relevant item among the {n} retrieved",
        "zh": "召回的 {n} 条结果中没有相关项",
    },
    "reason_ndcg": {
        "en": "gains at ranks {ranks} of the top {k}; the ideal ranking has {ideal} at ranks 1 to {ideal}",
        "zh": "前 {k} 个结果中有增益的名次：{ranks}；理想排序在第 1 至 {ideal} 位共 {ideal} 个",
    },
    "reason_no_citation": {"en": "the answer cites nothing", "zh": "回答没有任何引用"},
    "reason_no_citation_unanswerable": {
        "en": "no citation, as an unanswerable case should",
        "zh": "没有引用，符合不可回答问题的要求",
    },
    "reason_no_such_rank": {"en": "no retrieved item there", "zh": "该位置没有召回结果"},
    "reason_citations_all": {"en": "all {n} cited numbers support", "zh": "全部 {n} 处引用都有依据"},
    "reason_citations_bad": {
        "en": "{bad} of {n} cited numbers do not support: {items}",
        "zh": "{n} 处引用中 {bad} 处没有依据：{items}",
    },
    "reason_refusal_found": {"en": "refusal phrase found: {phrase}", "zh": "找到拒答用语：{phrase}"},
    "reason_refusal_missing": {
        "en": "no refusal phrase in the answer of an unanswerable case",
        "zh": "不可回答的问题，但回答中没有拒答用语",
    },
    "reason_no_facts": {"en": "the case lists no expected facts", "zh": "该样本没有列出期望事实"},
    "reason_facts_all": {"en": "all {n} expected facts found", "zh": "全部 {n} 条期望事实都出现在回答中"},
    "reason_facts_missing": {
        "en": "{missing} of {n} expected facts missing: {items}",
        "zh": "{n} 条期望事实中缺少 {missing} 条：{items}",
    },
    # The Markdown summaries of gate and diff, and the metric table.
    "gate_passed": {"en": "✅ Release gate {gates}: PASSED", "zh": "✅ 发布门禁 {gates}：通过"},
    "gate_failed": {"en": "❌ Release gate {gates}: FAILED", "zh": "❌ 发布门禁 {gates}：未通过"},
    "rules_passed": {"en": "All {n} rules passed.", "zh": "全部 {n} 条规则通过。"},
    "rules_failed": {"en": "{failed} of {n} rules did not pass.", "zh": "{n} 条规则中 {failed} 条未通过。"},
    "rules_undecided": {
        "en": "{undecided} of them could not be decided (a missing score is never a pass).",
        "zh": "其中 {undecided} 条无法判定（缺失的分数不算通过）。",
    },
    "diff_title": {
        "en": "Candidate vs baseline: {better} better, {worse} worse, {flat} unchanged "
        "({unconfirmed} of the moves not significant)",
        "zh": "候选对比基线：{better} 项变好，{worse} 项变差，{flat} 项不变（其中 {unconfirmed} 项变化不显著）",
    },
    "worse_list": {"en": "Worse: {names}.", "zh": "变差的指标：{names}。"},
    "incomparable": {
        "en": "⚠️ Compared although not comparable: {what}.",
        "zh": "⚠️ 两次运行本不可比，仍按要求比较：{what}。",
    },
    "baseline": {"en": "Baseline", "zh": "基线"},
    "config": {"en": "config", "zh": "配置"},
    "chosen": {"en": "chosen by", "zh": "选择方式"},
    "default": {
        "en": "the newest finished comparable run after the baseline",
        "zh": "基线之后最新的、可比的已完成运行",
    },
    "dataset": {"en": "Dataset", "zh": "数据集"},
    "failed_rules": {"en": "Rules that did not pass", "zh": "未通过的规则"},
    "outcome": {"en": "Outcome", "zh": "结果"},
    "failed": {"en": "failed", "zh": "未通过"},
    "undecided": {"en": "undecided", "zh": "无法判定"},
    "metrics": {"en": "Metrics", "zh": "指标对比"},
    "better": {"en": "Better", "zh": "方向"},
    "ci": {"en": "{level:.0%} CI", "zh": "{level:.0%} 置信区间"},
    "p": {"en": "p", "zh": "p 值"},
    "moved": {"en": "Verdict", "zh": "判断"},
    "moved_better": {"en": "better", "zh": "变好"},
    "moved_worse": {"en": "worse", "zh": "变差"},
    "moved_flat": {"en": "flat", "zh": "持平"},
    "moved_not_comparable": {"en": "not comparable", "zh": "不可比"},
    "moved_better_ns": {"en": "better, not significant", "zh": "变好（不显著）"},
    "moved_worse_ns": {"en": "worse, not significant", "zh": "变差（不显著）"},
    "moved_mixed": {"en": "flat on average", "zh": "平均持平"},
    "moved_none": {"en": "—", "zh": "—"},
    "moved_noise": {"en": "below noise floor", "zh": "低于噪声下限"},
    "unchanged": {"en": "unchanged", "zh": "不变"},
    "not_significant": {"en": "not significant", "zh": "不显著"},
    # The rows of the RAG evaluation article's decision table (ragexp.compare.diff.diagnose).
    "stage_retrieval": {
        "en": "recall and MRR down: look at parsing, chunking and recall first",
        "zh": "召回与 MRR 同时下降：先查解析、分块与召回",
    },
    "stage_rerank": {
        "en": "recall flat but MRR down: fusion or rerank regressed",
        "zh": "召回不变而 MRR 下降：融合或重排退化",
    },
    "stage_answer": {
        "en": "retrieval flat but answer accuracy down: prompt, model or context assembly",
        "zh": "检索不变而答案准确率下降：查 Prompt、模型或上下文组织",
    },
    "stage_citation": {
        "en": "citation precision down: the citation protocol or its validation",
        "zh": "引用精度下降：查引用协议或其校验",
    },
    "stage_tradeoff": {
        "en": "quality up but P95 latency doubled: a product trade-off, not an automatic accept",
        "zh": "质量上升但 P95 延迟翻倍：需要产品权衡，不是自动接受",
    },
    "no_worst": {"en": "No case regressed.", "zh": "没有样本退步。"},
    "case": {"en": "Case", "zh": "样本"},
    "regression": {"en": "Regression", "zh": "退步量"},
    "changes": {"en": "What changed", "zh": "变化"},
    "error": {"en": "Candidate error", "zh": "候选的错误"},
    "errored": {"en": "errored", "zh": "出错"},
    "stage": {"en": "Likely stage", "zh": "可能出问题的环节"},
    # The report's per-hop section (multi-hop sets).
    "hops": {"en": "Per hop", "zh": "按跳"},
    "hops_intro": {
        "en": "Each hop's gold against the system's retrieval call of the same position; means over the cases scored.",
        "zh": "每一跳的标注证据与系统同一位置的检索调用比对；均值取自有分数的问题。",
    },
    "hops_first_failing": {
        "en": "First failing hop (the first hop whose gold is not all in the top K), cases:",
        "zh": "第一个失败的跳（其标注证据未全部进入前 K 的第一跳），问题数：",
    },
    "hops_moved": {
        "en": "How the first failing hop moved, cases by baseline (rows) and candidate (columns), {n} paired:",
        "zh": "第一个失败的跳如何变化：行为基线、列为候选，共 {n} 对问题：",
    },
    "hop_column": {"en": "hop", "zh": "跳"},
    "attribution": {"en": "Attribution by replay", "zh": "回放归因"},
    "attribution_about": {
        "en": "Each answer metric's change split into what the candidate retrieved, how it answered, and "
        "their interaction (2×2 factorial decomposition, baseline as reference cell: retrieval + "
        "generation + interaction = total); {replayed} cases replayed; {level}% paired bootstrap intervals.",
        "zh": "把每个回答类指标的变化拆成：候选版本检索到的内容、它的回答方式，以及两者的交互（2×2 析因分解，"
        "以基线为参照格：检索 + 生成 + 交互 = 总变化）；回放了 {replayed} 条用例；区间为 {level}% 配对自助法区间。",
    },
    "attribution_bar": {"en": "Parts of each change (total: the dot)", "zh": "各指标变化的组成（圆点：总变化）"},
    "attribution_causes": {"en": "Cases by cause", "zh": "按原因分组的用例"},
    "attribution_errors": {
        "en": "{n} cases could not be attributed (a replay failed): they are left out of every part.",
        "zh": "{n} 条用例无法归因（回放失败），它们不计入任何一部分。",
    },
    "part_total": {"en": "Total", "zh": "总变化"},
    "part_retrieval": {"en": "Retrieval", "zh": "检索"},
    "part_generation": {"en": "Generation", "zh": "生成"},
    "part_interaction": {"en": "Interaction", "zh": "交互"},
    "cause": {"en": "Cause", "zh": "原因"},
    "case_ids": {"en": "Cases", "zh": "用例"},
    "detectable": {"en": "Detectable", "zh": "可检测变化"},
    "underpowered": {"en": "What this gate cannot see", "zh": "该门禁看不出的变化"},
    "detectable_note": {
        "en": "Detectable: the smallest true change each paired comparison finds 4 times in 5 "
        "(two-sided, {level:.0%} confidence).",
        "zh": "可检测变化：配对比较有 80% 把握发现的最小真实变化（双侧，{level:.0%} 置信度）。",
    },
    "footer": {
        "en": "Statistics are paired over the cases both runs scored; a missing score is never counted as zero.",
        "zh": "统计量按两次运行都有分数的样本配对计算；缺失的分数不会按 0 计。",
    },
    "better_higher": {"en": "higher", "zh": "越高越好"},
    "better_lower": {"en": "lower", "zh": "越低越好"},
    "most_regressed": {"en": "Most regressed cases", "zh": "退步最多的样本"},
    # Under a gate rule too weak to see the drop it allows (ragexp.compare.power).
    "cannot_tell": {
        "en": "this gate cannot tell a drop of {drop} from noise with {n} {units} (detectable: {detectable}; {needed})",
        "zh": "该门禁在 {n} {units}上无法把 {drop} 的下降与噪声区分开（可检测：{detectable}；{needed}）",
    },
    "cannot_tell_increase": {
        "en": (
            "this gate cannot tell an increase of {drop} from noise with {n} {units} "
            "(detectable: {detectable}; {needed})"
        ),
        "zh": "该门禁在 {n} {units}上无法把 {drop} 的上升与噪声区分开（可检测：{detectable}；{needed}）",
    },
    "units_case": {"en": "cases", "zh": "条样本"},
    "units_conversation": {"en": "conversations", "zh": "段对话"},
    "needed_some": {"en": "about {needed} cases would be needed", "zh": "约需 {needed} 条样本"},
    "needed_none": {"en": "no number of cases would be enough", "zh": "样本再多也不够"},
    "too_few": {"en": "none below {floor} paired cases", "zh": "少于 {floor} 条配对样本时无法检测任何变化"},
    "too_few_discordant": {
        "en": "none with {discordant} discordant pairs",
        "zh": "仅 {discordant} 对结果不一致的样本时无法检测任何变化",
    },
    # Why a figure is missing: every "—" a table shows is explained under it (ragexp.compare.missing).
    "dash_means": {"en": "why a figure is missing (—):", "zh": "缺少数值（—）的原因："},
    "not_measured_baseline": {"en": "the baseline run did not measure it", "zh": "基线运行没有测这个指标"},
    "not_measured_candidate": {"en": "the candidate run did not measure it", "zh": "候选运行没有测这个指标"},
    "unscored_baseline": {
        "en": "no case of the baseline run has a score for it",
        "zh": "基线运行没有任何样本有这个指标的分数",
    },
    "unscored_candidate": {
        "en": "no case of the candidate run has a score for it",
        "zh": "候选运行没有任何样本有这个指标的分数",
    },
    "run_level": {
        "en": "a run-level figure, not a mean of per-case values: no paired interval, p-value or detectable change",
        "zh": "运行级指标，不是逐条分数的均值：没有配对区间、p 值和可检测变化",
    },
    "no_pairs": {
        "en": "no case has a score in both runs: no paired interval, p-value or detectable change",
        "zh": "没有样本在两次运行中都有分数：没有配对区间、p 值和可检测变化",
    },
    "ci_unbounded": {
        "en": "too few pairs for the paired test to bound the interval at this confidence",
        "zh": "配对样本太少，无法在该置信度下给出有限的区间",
    },
    "no_detectable": {"en": "detectable change: {why}", "zh": "可检测变化：{why}"},
    "dash_case": {
        "en": "— in a case's change: that run has no score for the case (it errored, or the metric does not score it)",
        "zh": "样本变化中的“—”：该次运行中这条样本没有分数（出错，或该指标不对它打分）",
    },
    "dash_run_value": {
        "en": "— in the baseline or candidate column: that run has no value for the metric",
        "zh": "基线或候选列中的“—”：该次运行没有这个指标的数值",
    },
}


def t(key: str, language: str, **values: object) -> str:
    """The phrase ``key`` in ``language``, its ``{placeholders}`` filled from ``values``."""
    text = PHRASES[key][language]
    return text.format(**values) if values else text
