"""Every sentence of the report, in Chinese and English."""

from __future__ import annotations

TEXT: dict[str, dict[str, str]] = {
    "title": {"zh": "RAG 评测报告", "en": "RAG evaluation report"},
    "identity": {"zh": "运行身份", "en": "Identity"},
    "official": {
        "zh": "第一栏 · 指标的定义与出处（官方刻度）",
        "en": "Column 1 · What the metrics are, and who defines them",
    },
    "self_defined": {"zh": "第二栏 · 本项目自建的基线与判断", "en": "Column 2 · Self-defined baseline and judgement"},
    "honesty": {
        "zh": "本报告中合格线（门禁阈值）与评估数据集均为本项目自定，官方未给出任何阈值，也不提供考题。"
        "评估数据集共 {n} 条，由 {author} 编写，只能证明系统在这些题目上的表现，"
        "不能证明在客户真实问题分布上的表现；离线指标（召回、MRR、nDCG、引用精度、答案准确率、P95）"
        "由本项目定义，judge 指标的定义与取值范围来自 ragas / MindSDK 评估模块，但其分数依赖所用判官模型。",
        "en": "The pass marks (gate thresholds) and the evaluation dataset in this report are self-defined by this "
        "project: no official source gives thresholds or test questions. The dataset has {n} cases written by "
        "{author}; it shows how the system does on these questions, not on the distribution of a customer's "
        "real questions. The offline metrics (recall, MRR, nDCG, citation precision, answer accuracy, P95) are "
        "defined by this project; the judge metrics' definitions and ranges come from ragas / the MindSDK "
        "evaluation module, but their scores depend on the judge model used.",
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
    "item": {"zh": "项", "en": "Item"},
    "value": {"zh": "取值", "en": "Value"},
    "who": {"zh": "谁定的", "en": "Set by"},
    "self": {"zh": "自定", "en": "self-defined"},
    "dataset": {"zh": "评估数据集", "en": "Evaluation dataset"},
    "cases": {"zh": "条", "en": "cases"},
    "thresholds": {"zh": "合格线（门禁规则）", "en": "Pass marks (gate rules)"},
    "baseline": {"zh": "对比基线", "en": "Baseline"},
    "none": {"zh": "无", "en": "none"},
    "results": {"zh": "结果与分布", "en": "Results and distributions"},
    "mean": {"zh": "均值", "en": "Mean"},
    "scored": {"zh": "有分数的样本", "en": "Scored cases"},
    "errored": {"zh": "出错样本（已排除）", "en": "Errored cases (excluded)"},
    "errors_list": {"zh": "出错样本清单", "en": "Errored cases"},
    "no_errors": {"zh": "没有出错的样本。", "en": "No case errored."},
    "histogram": {"zh": "逐条分数分布", "en": "Per-case score distribution"},
    "worst": {"zh": "最差样本", "en": "Worst cases"},
    "question": {"zh": "问题", "en": "Question"},
    "answer": {"zh": "回答", "en": "Answer"},
    "retrieved": {"zh": "召回的 id", "en": "Retrieved ids"},
    "comparison": {"zh": "与基线对比", "en": "Comparison with the baseline"},
    "delta": {"zh": "差值", "en": "Delta"},
    "ci": {"zh": "95% 置信区间", "en": "95% CI"},
    "p": {"zh": "p 值", "en": "p-value"},
    "updown": {"zh": "变好/变差/不变", "en": "Up/down/same"},
    "scatter": {"zh": "逐条对比（基线 vs 候选）", "en": "Per case: baseline vs candidate"},
    "gate": {"zh": "发布门禁", "en": "Release gate"},
    "passed": {"zh": "通过", "en": "PASSED"},
    "failed": {"zh": "未通过", "en": "FAILED"},
    "rule": {"zh": "规则", "en": "Rule"},
    "why": {"zh": "原因", "en": "Why"},
    "threshold": {"zh": "阈值", "en": "Threshold"},
    "candidate": {"zh": "候选", "en": "Candidate"},
    "diagnosis": {"zh": "可能出问题的环节", "en": "Likely stage"},
    "no_diagnosis": {"zh": "指标变化未指向特定环节。", "en": "The metric moves point at no particular stage."},
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
}


def t(key: str, language: str) -> str:
    return TEXT[key][language]
