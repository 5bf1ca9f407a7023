"""Shared fixtures: a real SQLite MLflow store in a temporary folder, an in-process CLI, and one
MLflow tracking server for the whole session; and the ``system`` marker (``make test-fast`` leaves
those tests out, ``make test`` runs them)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")


SYSTEM_TESTS: dict[str, Sequence[str]] = {
    # module -> its end-to-end tests: whole processes, servers (started, proxied, killed), a browser,
    # a wheel install, Ray clusters, whole runs and comparisons. ("*",): the whole module. Listed
    # here rather than marked in each file so that the edit loop's subset is chosen in one place;
    # a name that no longer exists is a usage error, not a silent drop.
    "test_cli_output.py": (
        "test_progress_bar_with_rate_and_eta_on_a_terminal_only",
        "test_every_long_phase_of_a_large_replay_run_shows_progress",
    ),
    "test_docs.py": (
        "test_gate_and_sample_pages_commands_run_as_shown",
        "test_readme_commands_run_as_shown",
    ),
    "test_draft.py": (
        "test_interrupted_drafting_resumes_without_paying_twice",
        "test_screening_before_a_draft_counts",
    ),
    "test_draft_review.py": (
        "test_english_draft_with_screened_cases_passing_through",
        "test_review_and_accept_refuse_bad_input_in_one_line",
        "test_review_queue_round_trip_on_the_tracking_server",
    ),
    "test_failures_one_line.py": (
        "test_a_repository_gate_without_bounds_fails_in_one_line_and_its_replacement_is_said",
    ),
    "test_hostile_text.py": ("test_hostile_ids_and_bodies_stay_text_in_summaries_junit_report_and_terminal",),
    "test_http.py": (
        "test_faults_are_retried_or_recorded_per_case",
        "test_missing_secret_variable_is_an_error_before_any_work",
        "test_resume_after_a_crash_evaluates_only_missing_cases",
        "test_sample_service_end_to_end",
        "test_secrets_never_reach_the_store_or_the_terminal",
        "test_service_that_answers_nothing_stops_the_run_early",
        "test_tls_with_a_private_ca",
        "test_unreachable_service_is_one_line_and_no_run",
        "test_walkthrough_two_service_versions_diff_and_gate",
    ),
    "test_identifiers.py": (
        "test_a_promotion_tag_mlflow_refuses_is_refused_before_the_gate",
        "test_a_sweep_with_long_points_lands_on_the_team_server",
        "test_a_token_echoed_as_a_stage_name_is_masked_in_the_checkpoint",
        "test_long_and_unusual_case_ids_are_one_trace_each",
        "test_stage_names_mlflow_refuses_finish_the_run_under_safe_metric_keys",
        "test_values_at_every_limit_are_written_whole_on_the_team_server",
    ),
    "test_install.py": ("*",),
    "test_intervals.py": ("test_coverage_at_nominal_95_on_25_discrete_pairs",),
    "test_judge.py": (
        "test_a_rerun_served_by_the_cache_keeps_a_case_with_unusable_judge_output_as_that_case_error",
        "test_half_written_prompt_files_in_the_state_dir_are_made_again",
        "test_judge_values_errors_cache_and_repeats",
        "test_mindie_kind_tei_embeddings_and_chinese_prompts",
    ),
    "test_label_queue.py": ("*",),
    "test_labels.py": (
        "test_a_corpus_of_another_dataset_is_not_audited_against",
        "test_diff_and_gate_use_paired_ppi_on_shared_labelled_cases",
        "test_kb_zh_with_the_judge_preset_shows_calibration_and_the_audit",
        "test_run_reports_calibration_ppi_and_audit",
    ),
    "test_lost_replies.py": ("*",),
    "test_power.py": (
        "test_diff_and_gate_say_what_they_can_detect_without_changing_a_verdict",
        "test_junit_and_summary_flag_an_underpowered_rule",
        "test_power_before_any_candidate",
        "test_sign_flip_test_detects_the_detectable_effect_four_times_in_five_continuous",
    ),
    "test_python_system.py": (
        "test_a_bad_target_is_one_line_before_any_run",
        "test_a_call_that_never_returns_lets_the_process_exit",
        "test_a_field_of_the_wrong_type_is_an_error_naming_field_and_expression",
        "test_a_slow_call_times_out_and_the_run_goes_on",
        "test_an_async_target_that_blocks_its_loop_ends_the_run",
        "test_an_exception_is_an_error_for_its_case_with_secrets_masked",
        "test_async_function_returning_a_pydantic_model",
        "test_config_hash_follows_the_target_file",
        "test_input_template_is_the_one_argument",
        "test_keyword_function_gets_every_case_value_and_its_output_is_recorded",
        "test_langchain_retrieval_chain_through_its_preset",
        "test_llamaindex_query_engine_through_its_preset",
        "test_on_the_tracking_server",
        "test_one_positional_parameter_gets_the_question_and_a_dataclass_is_mapped",
    ),
    "test_ray.py": ("*",),
    "test_release.py": (
        "test_a_tag_baseline_is_found_in_another_experiment_when_the_candidates_has_none",
        "test_baseline_selectors",
        "test_ci_templates_run_their_steps_against_a_tracking_server",
        "test_default_candidate_is_the_newest_comparable_run_after_the_baseline",
        "test_junit_report_validates_and_carries_every_rule",
        "test_promote_moves_the_tag_only_when_the_gate_passes",
        "test_summary_of_gate_and_diff_in_both_languages",
        "test_two_concurrent_promotions_have_one_winner",
        "test_unwritable_outputs_are_refused_before_any_work",
    ),
    "test_reliability.py": (
        "test_a_failing_judge_aborts_after_its_configured_number_of_calls",
        "test_a_read_only_store_can_be_read_but_not_run_into",
        "test_a_run_where_every_case_errored_exits_1_and_stays_marked",
        "test_a_second_resume_of_the_same_run_is_refused",
        "test_a_secret_that_cannot_be_a_header_is_refused_naming_the_variable",
        "test_a_secret_with_a_line_ending_is_stripped_and_never_recorded",
        "test_a_service_that_never_answers_aborts_the_run",
        "test_a_tracking_server_killed_mid_run_fails_in_bounded_time_and_resume_completes",
        "test_all_zero_judge_embeddings_are_a_case_error_not_a_warning",
        "test_an_interrupted_run_says_how_to_resume_it",
        "test_each_run_keeps_its_own_space_reserve_and_leaves_no_lock_file",
        "test_k_must_be_an_integer_and_unicode_values_need_no_quotes",
        "test_kill9_then_resume_asks_no_answered_case_again",
        "test_replies_the_code_cannot_hold_are_contract_errors",
        "test_resume_retries_transport_failures_and_brings_the_tags_up_to_date",
        "test_retry_errors_asks_the_other_failures_again",
        "test_the_judge_key_is_stripped_scrubbed_and_never_recorded",
        "test_the_timeout_is_a_deadline_for_the_whole_attempt",
    ),
    "test_report.py": ("*",),
    "test_run.py": (
        "test_default_run_logs_everything",
        "test_invalid_dataset_creates_no_run",
        "test_metric_needing_missing_field_is_refused_before_any_run",
        "test_replay_values_match_an_independent_computation",
        "test_terminal_summary_and_runs_listing",
    ),
    "test_sample.py": (
        "test_default_run_is_the_sample_system_with_explainable_misses",
        "test_demo_end_to_end",
        "test_deterministic_and_same_hash",
        "test_http_service_and_in_process_system_answer_alike",
    ),
    "test_scale.py": ("*",),
    "test_sqlite_writer.py": (
        "test_a_run_on_an_existing_store_does_not_import_mlflow",
        "test_a_run_writes_the_rows_mlflow_writes",
        "test_traces_are_the_rows_mlflow_writes",
    ),
    "test_store_reader.py": ("test_diff_and_gate_read_without_mlflow_and_record_where_mlflow_sees_it",),
    "test_systems.py": (
        "test_a_stalled_stream_is_a_timeout",
        "test_a_streamed_service_behind_a_private_ca",
    ),
    "test_traces.py": (
        "test_a_server_that_stops_answering_stops_the_trace_write_within_the_tracking_timeout",
        "test_diff_and_gate_leave_a_record_on_the_candidate",
        "test_huge_answer_is_cut_in_the_trace_not_in_cases_jsonl",
        "test_judge_metrics_are_llm_judge_assessments",
        "test_six_parallel_runs_lose_no_trace",
        "test_store_error_while_tracing_marks_the_run_and_resume_gives_one_trace_per_case",
        "test_sweep_points_each_have_their_traces",
    ),
    "test_ui.py": ("*",),
    "test_json_output.py": ("test_every_commands_json_is_strict_on_data_with_non_finite_values",),
    "test_settings.py": ("test_every_store_command_takes_both_spellings_with_one_precedence",),
    "test_custom_metrics.py": (
        "test_a_changed_rubric_or_function_is_not_comparable_for_that_metric",
        "test_a_python_metric_is_scored_logged_diffed_and_gated",
        "test_a_raising_a_wrong_and_an_out_of_range_value_are_errors_never_zero",
        "test_a_rationale_is_recorded_in_cases_and_on_the_trace",
        "test_a_rubric_is_judged_through_the_judge_client_cached_and_repeated",
        "test_a_rubric_is_labelled_in_a_review_queue_and_calibrated_against_people",
        "test_a_slow_call_times_out_prints_go_to_stderr_and_calls_run_on_worker_threads",
        "test_an_mlflow_scorer_is_called_as_mlflow_calls_it",
        "test_the_report_says_defined_by_you",
    ),
    "test_evidence.py": (
        "test_a_reindexed_service_keeps_its_scores_on_evidence",
        "test_runs_of_different_chunkings_on_the_same_evidence_are_comparable",
        "test_the_sample_service_serves_windows_with_their_documents",
    ),
    "test_found_nothing.py": (
        "test_a_json_reply_after_a_byte_order_mark_is_read",
        "test_a_mapped_service_whose_expression_misses_is_an_error_not_a_zero",
        "test_a_streamed_service_that_sends_no_text_is_an_error_and_real_endings_are_read",
        "test_an_ndjson_stream_cut_mid_line_is_asked_again_by_resume",
        "test_the_probe_marks_an_output_no_chosen_metric_reads_and_passes",
    ),
    "test_user_code.py": (
        "test_a_module_that_raises_keyboardinterrupt_at_import_is_its_error",
        "test_an_import_that_hangs_is_bounded_by_the_timeout",
        "test_the_probe_keeps_stdout_for_its_report",
        "test_the_users_ctrl_c_during_a_python_run_is_still_exit_130",
        "test_what_a_target_prints_goes_to_stderr_escaped_and_json_still_parses",
    ),
    "test_stage_spans.py": (
        "test_a_mapped_services_scores_are_on_the_retrieval_span",
        "test_the_sample_service_over_http_gives_the_same_stage_detail",
    ),
    "test_service_faults.py": (
        "test_a_4xx_shows_the_servers_reason_masked",
        "test_a_reply_that_cannot_be_decoded_is_that_cases_error",
        "test_a_service_without_auth_is_asked_without_a_key",
        "test_the_probe_reads_an_error_stream_as_the_run_does",
    ),
    "test_words.py": ("test_demo_pair_diff_words_what_changed_and_the_gate_that_ran",),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "system: end-to-end test (real processes, servers, a browser, a wheel install); "
        "left out by `make test-fast`, run by `make test` (tests/conftest.py SYSTEM_TESTS)",
    )
    config.addinivalue_line(
        "markers",
        "differential: compares what ragexp writes or reads directly with MLflow's own rows, span JSON or "
        "answers; `make test-mlflow-next` runs these under the newest MLflow on the registry",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    checked: set[str] = set()
    for item in items:
        module = item.module if isinstance(item, pytest.Function) else None
        names = SYSTEM_TESTS.get(item.path.name)
        if module is None or names is None:
            continue
        if item.path.name not in checked:
            checked.add(item.path.name)
            unknown = [n for n in names if n != "*" and not callable(getattr(module, n, None))]
            if unknown:
                raise pytest.UsageError(f"tests/conftest.py SYSTEM_TESTS: {item.path.name} has no {', '.join(unknown)}")
        if "*" in names or item.originalname in names:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's MLflow tracking server: the one CI starts (``RAGEXP_TEST_MLFLOW_SERVER``)
    when it is set, else one ``mlflow server`` over a SQLite store started here once and shared by
    every test that asks for it. A test that kills or restarts a server starts its own
    (``tests.servers.procs.mlflow_server``)."""
    shared = os.environ.get("RAGEXP_TEST_MLFLOW_SERVER")
    if shared:
        yield shared.rstrip("/")
        return
    from tests.servers.procs import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("server"), workers=2) as url:
        yield url


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def invoke(*args: str) -> Result:
    """Run ``ragexp ARGS`` in this process through the real entry point (exit codes included)."""
    from ragexp.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["ragexp", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
        gc.enable()
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def store_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite store; MLFLOW_TRACKING_URI points at it for in-process commands."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def ragexp(store_uri: str) -> Iterator[Any]:
    yield invoke


IMPORT_PROBE = (
    "import atexit, sys\n"
    "def said():\n"
    "    print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow', file=sys.stderr)\n"
    "atexit.register(said)\n"
    "from ragexp.cli.app import main\n"
    "sys.argv = ['ragexp', *sys.argv[1:]]\n"
    "main()\n"
)
"""``python -c IMPORT_PROBE ARGS``: ``ragexp ARGS`` in a fresh process, whose last line on stderr
says whether it imported mlflow."""


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path
