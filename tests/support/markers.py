"""Where the tests' selection markers are set: the one table :data:`MARKS` (``tests/conftest.py`` applies it).

Four markers pick the fast subset, ``pytest -m "not slow and not node and not browser and not py313"``
(README.md), out of the whole suite (no ``-m``):

* ``slow``: a test that takes a tenth of a second of CPU or a quarter second of wall time or more (measure
  with ``--durations``; the fast subset then runs in under a minute on 2 cores), a sweep, a crash or
  corruption sweep, a large model, a torch dynamo export (its first one costs seconds in each worker);
* ``node``: runs the JavaScript client in Node (npm-installs its packages into the test cache);
* ``browser``: drives Debian's Chromium (installed with apt-get when missing);
* ``py313``: runs in the cached Python 3.13 venv with stock onnxruntime (every test that uses the
  ``portable_python`` fixture).

They are set here and nowhere else: no ``pytestmark``, decorator or ``pytest.param(marks=...)`` of these
four in a test module. A key is a test's node id, or its beginning up to a ``::`` or a ``[`` (a file,
a class, a test function with all its parameter cells); ``*`` stands for any characters. A test gets
the markers of every key that matches it. ``tests/conftest.py`` warns about a key that matches no test
of a whole-suite run, and about a test that uses ``portable_python`` without ``py313`` (marking it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

#: Node id (or its beginning, or a ``*`` pattern) -> markers, space-separated.
MARKS: dict[str, str] = {
    # artifacts
    "tests/artifacts/test_artifacts.py::test_ort_format_models_train_like_onnx_ones": "slow",
    "tests/artifacts/test_atomic_directories.py::test_concurrent_writers_all_succeed_with_one_complete_set_per_prefix": "slow",
    "tests/artifacts/test_atomic_directories.py::test_second_writer_waits_for_the_lock_then_times_out_clearly": "slow",
    "tests/artifacts/test_atomic_directories.py::test_stale_staging_directories_of_dead_processes_are_recovered": "slow",
    "tests/artifacts/test_atomic_directories.py::test_writer_killed_at_each_move_of_the_commit_leaves_a_complete_set": "slow",
    "tests/artifacts/test_atomic_directories.py::test_writer_killed_at_random_moments": "slow",
    "tests/artifacts/test_build_edge_cases.py::test_if_reading_values_of_trainable_parameters_is_a_gradient_error_not_a_crash": "slow",
    "tests/artifacts/test_concurrent_writers.py::test_adapters_written_at_once_are_one_writers_pair": "slow",
    "tests/artifacts/test_concurrent_writers.py::test_processes_write_complete_sets_and_leave_nothing": "slow",
    "tests/artifacts/test_concurrent_writers.py::test_threads_write_complete_sets_and_leave_nothing": "slow",
    "tests/artifacts/test_concurrent_writers.py::test_web_state_written_while_the_set_is_replaced_is_one_checkpoints": "slow",
    "tests/artifacts/test_concurrent_writers.py::test_web_state_of_a_set_caught_between_old_and_new_waits_for_the_new_one": "slow",
    "tests/artifacts/test_exporter_ties.py": "slow",
    "tests/artifacts/test_generate_any_python.py": "py313",
    "tests/artifacts/test_kill_safe_generation.py::test_generation_killed_at_random_points_leaves_the_old_set_or_nothing": "slow",
    "tests/artifacts/test_scale.py::test_benchmark_quick_run": "slow",
    "tests/artifacts/test_scale.py::test_import_does_not_load_heavy_modules": "slow",
    # blocks
    "tests/blocks/test_arithmetic_property.py::test_random_losses_and_arithmetic_match_torch_or_fail_clearly": "slow",
    "tests/blocks/test_script.py::test_import_onnxblocks_does_not_import_onnxscript": "slow",
    # checkpoint
    "tests/checkpoint/test_checkpoint.py::test_memory_stays_bounded_while_streaming": "slow",
    "tests/checkpoint/test_checkpoint.py::test_training_continues_from_a_streamed_checkpoint": "slow",
    "tests/checkpoint/test_checkpoint_format.py::test_corruption_sweep_every_byte": "slow",
    "tests/checkpoint/test_checkpoint_format.py::test_corruption_sweep_external_data": "slow",
    "tests/checkpoint/test_checkpoint_format.py::test_corruption_sweep_of_a_checkpoint_ort_wrote_after_training": "slow",
    "tests/checkpoint/test_checkpoint_guards.py::test_a_one_byte_corruption_that_crashes_onnx_runtime_is_refused_everywhere": "slow",
    "tests/checkpoint/test_checkpoint_properties.py": "slow",
    "tests/checkpoint/test_crash_and_corruption.py": "slow",
    # cli
    "tests/cli/test_demo.py::test_demo_writes_and_reports_every_file": "slow",  # runs the demo
    "tests/cli/test_demo.py::test_custom_loss_is_smoothed_cross_entropy_plus_l2": "slow",
    "tests/cli/test_cli.py::test_demo_that_misses_its_target_exits_1": "slow",
    "tests/cli/test_cli.py::test_subprocess_exit_code_and_single_error_line": "slow",
    "tests/cli/test_cli.py::test_train_save_resume_export": "slow",
    "tests/cli/test_cli_quiet.py::test_bad_data_file_on_portable_artifacts_is_one_line_and_exit_3": "slow",
    "tests/cli/test_cli_quiet.py::test_generation_and_a_portable_training_run_print_nothing_to_stderr": "slow",
    "tests/cli/test_cli_quiet.py::test_missing_output_directories_are_created": "slow",
    "tests/cli/test_cli_quiet.py::test_the_log_level_can_be_raised_by_environment": "slow",
    "tests/cli/test_demo.py::test_demo_reaches_the_stated_accuracy": "slow",
    "tests/cli/test_demo.py::test_exported_model_runs_in_inference_session": "slow",
    "tests/cli/test_doctor.py": "slow",
    "tests/cli/test_interrupts.py::test_a_command_past_its_timeout_is_killed": "slow",
    "tests/cli/test_interrupts.py::test_a_waited_command_is_killed_when_the_signal_comes_during_the_wait": "slow",
    "tests/cli/test_interrupts.py::test_a_waited_command_stops_on_a_signal_whose_exception_was_swallowed": "slow",
    "tests/cli/test_lora_demo.py::test_the_demo_files_load_back": "slow",
    "tests/cli/test_lora_demo.py::test_the_fine_tune_learns_the_shifted_task": "slow",
    # compat
    "tests/compat/test_compat.py::test_eval_model_has_no_training_mode_and_matches_torch_eval[BatchNormModel]": "slow",
    "tests/compat/test_compat.py::test_training_graph_execution_matches_torch[BCEWithLogitsLoss]": "slow",
    "tests/compat/test_compat.py::test_training_graph_execution_matches_torch[CrossEntropyLoss]": "slow",
    "tests/compat/test_compat.py::test_weighted_average_model_composition": "slow",
    "tests/compat/test_legacy_gradient.py::test_gradient_graph_matches_torch_autograd[gpt]": "slow",
    "tests/compat/test_legacy_training.py::test_adam_weight_decay_mode_1_follows_the_legacy_kernel": "slow",
    "tests/compat/test_legacy_training.py::test_get_state_then_load_state_resumes_bit_exact": "slow",
    "tests/compat/test_legacy_training.py::test_legacy_program_trains_as_torch_on_stock_onnxruntime_313": "py313",
    "tests/compat/test_legacy_training.py::test_legacy_program_trains_as_torch_on_the_training_build": "slow",
    "tests/compat/test_legacy_training.py::test_load_state_and_run_check_names": "slow",
    "tests/compat/test_legacy_training.py::test_set_gradients_as_graph_outputs_fetches_the_gradients": "slow",
    "tests/compat/test_legacy_training.py::test_the_artifacts_are_cached_by_model_and_parameters": "slow",
    "tests/compat/test_legacy_training.py::test_weights_to_train_and_immutable_weights_choose_what_trains": "slow",
    "tests/compat/test_reference_blocks.py::test_custom_block_reads_a_large_initializer": "slow",
    "tests/compat/test_reference_blocks.py::test_custom_blocks_written_the_reference_way": "slow",
    "tests/compat/test_reference_blocks.py::test_label_encoder_composition": "slow",
    "tests/compat/test_reference_blocks.py::test_loss_input_names_pick_the_loss_inputs": "slow",
    "tests/compat/test_reference_blocks.py::test_weighted_average_of_losses": "slow",
    "tests/compat/test_reference_checkpoints.py::test_nominal_checkpoint_trains_like_the_complete_one": "slow",
    "tests/compat/test_reference_checkpoints.py::test_ort_format_files_train_like_the_onnx_files": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[bce-mean]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[bce-pos-weight-sum]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[ce-ignore]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[ce-mean]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[ce-weight-ignore-mean]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[ce-weight-ignore-sum]": "slow",
    "tests/compat/test_reference_losses.py::test_loss_gradients_match_torch_in_the_training_api[ce-weight]": "slow",
    "tests/compat/test_reference_parameters.py::test_eval_model_runs_in_inference_mode": "slow",
    "tests/compat/test_reference_parameters.py::test_frozen_and_trainable_parameters": "slow",
    "tests/compat/test_reference_training_api.py": "slow",
    # display
    "tests/display/test_display.py::test_10k_node_graph_renders_a_bounded_summary": "slow",
    "tests/display/test_display.py::test_focused_view_of_a_large_graph_stays_small": "slow",
    "tests/display/test_display.py::test_import_onnxblocks_does_not_import_display": "slow",
    "tests/display/test_display.py::test_repeated_layers_collapse_into_one_box_with_a_count": "slow",
    "tests/display/test_plot.py::test_png_never_touches_pyplot": "slow",
    "tests/display/test_plot.py::test_png_through_matplotlib": "slow",
    # families
    "tests/families/test_model_families.py::*[*-dynamo]": "slow",  # the first dynamo export costs seconds
    "tests/families/test_exporter_sweep.py": "slow",
    "tests/families/test_model_families.py::test_adamw_steps_track_torch": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[cnn-dynamo]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[cnn-torchscript]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[gpt-dynamo]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[gpt-onnxscript]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[gpt-torchscript]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[lstm-dynamo]": "slow",
    "tests/families/test_model_families.py::test_eval_model_matches_torch_eval[lstm-torchscript]": "slow",
    "tests/families/test_model_families.py::test_every_builtin_loss_matches_torch[bce]": "slow",
    "tests/families/test_model_families.py::test_every_builtin_loss_matches_torch[cross_entropy]": "slow",
    "tests/families/test_model_families.py::test_every_builtin_loss_matches_torch[huber]": "slow",
    "tests/families/test_model_families.py::test_every_builtin_loss_matches_torch[nll]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[cnn-dynamo]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[cnn-torchscript]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[gpt-dynamo]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[gpt-onnxscript]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[gpt-torchscript]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[gru-dynamo]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[gru-torchscript]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[lstm-dynamo]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[lstm-torchscript]": "slow",
    "tests/families/test_model_families.py::test_gradients_match_torch[mlp-dynamo]": "slow",
    # federated
    "tests/federated/test_browser_clients.py::test_two_tabs_reach_the_accuracy_and_a_tab_closed_mid_round_is_dropped": "slow browser",
    "tests/federated/test_js_clients.py::test_node_and_python_clients_average_like_separate_sessions_and_nan_is_dropped": "slow node",
    "tests/federated/test_cli_federate.py::test_a_stop_signal_stops_every_flower_process_and_exits_130": "slow",
    "tests/federated/test_cli_federate.py::test_one_round_of_fedavg_is_the_weighted_average_of_separate_sessions": "slow",
    "tests/federated/test_client.py::test_file_order_is_reproducible_and_shuffling_follows_the_seed": "slow",
    "tests/federated/test_client.py::test_frozen_parameters_never_travel": "slow",
    "tests/federated/test_client.py::test_importing_without_flower_names_the_extra": "slow",
    "tests/federated/test_client.py::test_local_training_is_sgd_from_the_global_parameters": "slow",
    "tests/federated/test_client.py::test_optimizer_state_starts_fresh_every_round": "slow",
    "tests/federated/test_client.py::test_portable_artifacts_train_the_same_on_the_portable_backend": "slow",
    "tests/federated/test_deployment.py::test_a_node_that_cannot_start_is_reported_with_its_log_and_nothing_is_left": "slow",
    "tests/federated/test_deployment.py::test_an_error_inside_the_block_stops_everything": "slow",
    "tests/federated/test_deployment.py::test_free_ports_differ_and_configs_render_as_flower_reads_them": "slow",
    "tests/federated/test_deployment.py::test_keyboard_interrupt_stops_everything": "slow",
    "tests/federated/test_deployment.py::test_one_round_aggregates_every_node_and_nothing_outlives_the_deployment": "slow",
    "tests/federated/test_faults_deployment.py": "slow",
    "tests/federated/test_fedprox.py": "slow",
    "tests/federated/test_hetero_clients.py": "py313 slow",
    "tests/federated/test_lora_federated.py": "slow",
    "tests/federated/test_node_cache.py::test_the_second_message_reads_the_rules_the_first_kept": "slow",
    "tests/federated/test_node_cache.py::test_rules_read_back_still_refuse_a_label_out_of_range": "slow",
    "tests/federated/test_node_cache.py::test_a_client_app_process_imports_no_server_no_graph_builder_and_no_onnxruntime": "slow",
    "tests/federated/test_optimizer_state.py": "slow",
    "tests/federated/test_relay.py": "slow",
    "tests/federated/test_simulation.py": "slow",
    # hub (issue 35 A: optimum exports made in their own venv, torch references)
    "tests/hub/test_from_hub.py": "slow",
    "tests/hub/test_from_hub_quantized.py": "py313 slow",  # issue 35 B: q4 from stock onnxruntime
    "tests/hub/test_text.py": "slow",
    "tests/hub/test_hub_cli.py": "slow",
    "tests/hub/test_families.py": "slow",
    # hub (issue 35 C: export_hub; a hand-made LLaMA hub folder, torch and transformers references)
    "tests/hub/test_export_hub.py": "slow",
    "tests/hub/test_transformers_js.py": "slow node browser",
    # gradient
    # the tie sweeps keep their float16 cells (ties are most common there) in the fast subset
    "tests/gradient/test_extrema_ties.py::test_reductions_share_ties_evenly_as_torch_amax[*-bfloat16-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_reductions_share_ties_evenly_as_torch_amax[*-float32-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_reductions_share_ties_evenly_as_torch_amax[*-float64-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_max_with_dim_gives_the_gradient_to_its_index[*-bfloat16-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_max_with_dim_gives_the_gradient_to_its_index[*-float32-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_max_with_dim_gives_the_gradient_to_its_index[*-float64-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_elementwise_extrema_give_half_to_each_tied_input[*-bfloat16-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_elementwise_extrema_give_half_to_each_tied_input[*-float32-*]": "slow",
    "tests/gradient/test_extrema_ties.py::test_elementwise_extrema_give_half_to_each_tied_input[*-float64-*]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-...i,i-symbolic]": "slow",
    "tests/gradient/test_recompute.py": "slow",
    "tests/gradient/test_recompute_budget.py::test_bad_budgets_are_refused_naming_recompute": "slow",
    "tests/gradient/test_recompute_budget.py::test_a_budget_chooses_blocks_whose_estimate_fits": "slow",
    "tests/gradient/test_recompute_budget.py::test_a_partial_choice_trains_like_no_recomputation": "slow",
    "tests/gradient/test_recompute_budget.py::test_the_cli_takes_auto_and_a_byte_budget": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-...ij,...jk->...ik-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-...j,...j->j-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-ab,bc,cd->-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-b...,b->b-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-bi,oij,bj->bo-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-bijk,jkl->bil-static]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-bijk,jkl->bil-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-i,i->-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-ij,ij->ij-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[fixed-sec,ecm->sm-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random1-abb,ba,ba->ba-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random10-,cc,bdd->cb-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random12-b...,ac...-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random16-c,c->c-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random17-...,,b...aa->...b-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random2-cb,bd,b->cbd-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random20-bba...,...->...ab-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random24-bad,d-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random29-e,df,d->-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random3-ee,,->e-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random31-cc...,b...,...b->...c-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random32-...ce,...,...-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random33-c...ce,a...,abc...-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random35-,aa,b->ba-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random39-bac,cc,baa->ac-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random5-...,...,b...ba->b...a-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random6-e,eea,f->efa-symbolic]": "slow",
    "tests/gradient/test_einsum_matmul.py::test_einsum_gradients_match_torch[random7-,dc,d->c-symbolic]": "slow",
    "tests/gradient/test_extrema_ties.py::test_generated_artifacts_share_a_float16_tie_as_torch_max[ReduceMax-portable]": "slow",
    "tests/gradient/test_extrema_ties.py::test_generated_artifacts_share_a_float16_tie_as_torch_max[ReduceMin-portable]": "slow",
    "tests/gradient/test_float64_gradients.py::test_float64_gradient_is_torchs_float64_gradient[GroupNormalization-18-portable]": "slow",
    "tests/gradient/test_float64_gradients.py::test_float64_gradient_is_torchs_float64_gradient[InstanceNormalization-portable]": "slow",
    "tests/gradient/test_frozen_reads.py": "slow",
    "tests/gradient/test_gradient_passes.py::test_chained_layer_norms_with_constant_or_shared_scale_and_bias_match_torch": "slow",
    "tests/gradient/test_gradient_passes.py::test_conv_transpose_becomes_conv_with_torch_values_and_gradients": "slow",
    "tests/gradient/test_gradient_passes.py::test_group_norms_become_elementary_with_torch_values_and_gradients": "slow",
    "tests/gradient/test_gradient_passes.py::test_rnn_gradient_matches_torch_after_unrolling": "slow",
    "tests/gradient/test_gradient_worker.py::test_a_worker_that_hangs_is_killed_at_its_timeout": "slow",
    "tests/gradient/test_gradient_worker.py::test_one_worker_serves_the_calls_and_is_restarted_when_it_died": "slow",
    "tests/gradient/test_gradient_worker.py::test_the_worker_explains_failures_as_in_process": "slow",
    "tests/gradient/test_gradient_worker.py::test_the_worker_writes_the_same_artifacts_byte_for_byte": "slow",
    "tests/gradient/test_inference_mode_gradients.py::test_generated_artifacts_train_through_inference_dropout_as_without_it": "slow",
    "tests/gradient/test_lazy_imports.py": "slow",
    # losses
    "tests/losses/test_chunked_cross_entropy.py::test_chunked_loss_matches_torch": "slow",
    "tests/losses/test_chunked_cross_entropy.py::test_head_in_the_loss_keeps_no_vocabulary_wide_value": "slow",
    "tests/losses/test_loss_grid.py": "py313",
    # optim
    "tests/optim/test_lamb.py": "slow",
    "tests/optim/test_optim.py::test_no_onnxruntime_import": "slow",
    "tests/optim/test_optimizers_node.py": "node",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[Adagrad-Adagrad-{'initial_accumulator_value': 0.5, 'eps': 1e-06}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[Adam-Adam-{'maximize': True, 'amsgrad': True}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[Adam-Adam-{}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[AdamW-AdamW-{}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[RMSprop-RMSprop-{'maximize': True, 'eps': 0.0001}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[RMSprop-RMSprop-{'momentum': 0.9}]": "slow",
    "tests/optim/test_torch_family.py::test_float32_ops_stay_within_an_ulp_per_step_of_torch[SGD-SGD-{'momentum': 0.9, 'nesterov': True}]": "slow",
    "tests/optim/test_torch_family.py::test_global_then_per_group_gradient_clipping_matches_torch": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adagrad-Adagrad-{'initial_accumulator_value': 0.5, 'eps': 1e-06}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adagrad-Adagrad-{'lr_decay': 0.1}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adagrad-Adagrad-{'weight_decay': 0.1, 'maximize': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adagrad-Adagrad-{}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adam-Adam-{'amsgrad': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adam-Adam-{'maximize': True, 'amsgrad': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adam-Adam-{'weight_decay': 0.1, 'betas': (0.8, 0.99), 'eps': 1e-06}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[Adam-Adam-{}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[AdamW-AdamW-{'amsgrad': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[AdamW-AdamW-{'weight_decay': 0.1, 'maximize': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[AdamW-AdamW-{}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[RMSprop-RMSprop-{'centered': True, 'alpha': 0.9}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[RMSprop-RMSprop-{'centered': True, 'momentum': 0.5, 'weight_decay': 0.1}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[RMSprop-RMSprop-{'maximize': True, 'eps': 0.0001}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[RMSprop-RMSprop-{'momentum': 0.9}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[RMSprop-RMSprop-{}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[SGD-SGD-{'momentum': 0.5, 'weight_decay': 0.05, 'maximize': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[SGD-SGD-{'momentum': 0.9, 'dampening': 0.3}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[SGD-SGD-{'momentum': 0.9, 'nesterov': True}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[SGD-SGD-{'momentum': 0.9}]": "slow",
    "tests/optim/test_torch_family.py::test_matches_torch_over_twenty_steps_with_two_groups[SGD-SGD-{'weight_decay': 0.1}]": "slow",
    "tests/optim/test_training_recipes.py::test_portable_training_matches_torch_and_resumes_bit_exact": "slow",
    "tests/optim/test_training_recipes.py::test_stock_onnxruntime_on_python_313_trains_as_torch_and_resumes_bit_exact": "py313",
    "tests/optim/test_training_recipes.py::test_training_build_drives_the_standard_optimizer_and_moves_between_backends": "slow",
    "tests/optim/test_weight_ema.py::test_the_checkpoint_holds_the_ema_and_resume_continues_it_bit_exactly": "slow",
    "tests/optim/test_weight_ema.py::test_use_ema_without_an_average_and_a_decay_mismatch_are_refused": "slow",
    "tests/optim/test_weight_ema.py::test_weight_ema_equals_torch_averaged_model_and_exports_the_average": "slow",
    # peft
    # a Hugging Face model: importing transformers costs a second in each worker
    "tests/peft/test_files.py::test_refuses_what_does_not_fit": "slow",
    "tests/peft/test_files.py::test_refuses_a_corrupt_weights_file_naming_it": "slow",
    "tests/peft/test_base_storage.py::test_a_cast_base_trains_as_float32_with_the_rounded_weights": "slow",
    "tests/peft/test_base_storage.py::test_a_generation_killed_after_writing_the_base_leaves_the_old_set": "slow",
    "tests/peft/test_base_storage.py::test_both_backends_train_as_with_the_base_inline[portable]": "slow",
    "tests/peft/test_base_storage.py::test_onnxruntime_keeps_the_cast_base_in_float16[onnxruntime-defaults]": "slow",
    "tests/peft/test_base_storage_runtimes.py::test_node_trains_a_shared_base_as_python_does": "node",
    "tests/peft/test_base_storage_runtimes.py::test_stock_onnxruntime_trains_a_shared_base_as_this_venv_does": "py313",
    "tests/peft/test_files.py::test_onnxblocks_reads_what_peft_writes": "slow",
    "tests/peft/test_files.py::test_peft_loads_what_onnxblocks_writes": "slow",
    "tests/peft/test_files.py::test_write_is_atomic_and_checks_shapes": "slow",
    "tests/peft/test_files_session.py::test_load_adapters_refuses_what_does_not_fit": "slow",
    "tests/peft/test_files_session.py::test_onnxblocks_loads_adapters_trained_and_saved_by_peft": "slow",
    "tests/peft/test_files_session.py::test_peft_loads_adapters_trained_and_saved_by_onnxblocks": "slow",
    "tests/peft/test_merge_artifacts.py": "slow",
    "tests/peft/test_parity_peft.py::test_portable_artifacts_match_peft_on_stock_onnxruntime": "py313 slow",
    "tests/peft/test_parity_peft.py::test_training_build_matches_peft": "slow",
    "tests/peft/test_qlora_parity.py": "slow",
    "tests/peft/test_quantized_table_rows.py": "slow",
    # quantized hub files: the 4-bit variants come from stock onnxruntime in the 3.13 venv
    "tests/peft/test_quantized_hub_bases.py": "py313 slow",
    "tests/peft/test_quantized_forms.py": "slow",
    "tests/peft/test_transform.py::test_targets_from_each_exporter_and_the_adapted_output[dynamo]": "slow",
    "tests/peft/test_transform_artifacts.py::test_adapters_train_alone_and_every_model_records_them[True]": "slow",
    "tests/peft/test_transform_artifacts.py::test_cli_lora_spec": "slow",
    # portable
    "tests/portable/test_bias_correction.py::test_default_portable_step_and_optimizer_graphs_hold_no_float64[AdamW-amsgrad-float32]": "slow",
    "tests/portable/test_bias_correction.py::test_default_portable_step_and_optimizer_graphs_hold_no_float64[groups-float32]": "slow",
    "tests/portable/test_bias_correction.py::test_the_scan_sees_the_float64_of_torch_exact_rounding": "slow",
    "tests/portable/test_float64_constants.py::test_the_float64_scale_becomes_its_float32_constant_with_the_same_outputs": "slow",
    "tests/portable/test_flat_pieces.py": "slow",
    "tests/portable/test_portable_artifacts.py::test_a_batch_of_another_size_gives_the_training_builds_gradients": "slow",
    "tests/portable/test_portable_artifacts.py::test_cli_portable_flag": "slow",
    "tests/portable/test_portable_artifacts.py::test_gradient_accumulation_adds_up_and_lazy_reset_overwrites": "slow",
    "tests/portable/test_portable_artifacts.py::test_portable_artifact_files_and_metadata": "slow",
    "tests/portable/test_portable_artifacts.py::test_portable_gradients_equal_the_training_build_across_the_sweep": "slow",
    "tests/portable/test_portable_artifacts.py::test_portable_models_track_the_training_build_and_torch": "slow",
    "tests/portable/test_portable_artifacts.py::test_sgd_and_no_fused_step": "slow",
    "tests/portable/test_portable_batch_sizes.py::test_cli_trains_a_last_short_batch_with_an_extra_output": "slow",
    "tests/portable/test_portable_batch_sizes.py::test_outputs_follow_the_batch_size_on_both_backends": "slow",
    "tests/portable/test_portable_batch_sizes.py::test_outputs_follow_the_batch_size_on_stock_onnxruntime": "py313",
    "tests/portable/test_portable_dynamic_lm.py": "slow",
    "tests/portable/test_portable_hf_sweep.py": "py313 slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding[(2, 2, 9)-(2, 2, 4)-SAME_LOWER-2]": "slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding[(2, 3, 6, 5)-(4, 3, 3, 3)-SAME_UPPER-1]": "slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding[(2, 3, 7)-(2, 3, 4)-SAME_UPPER-1]": "slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding_equals_torch[static-(2, 4, 7, 6)-(4, 1, 3, 3)-*]": "slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding_equals_torch[symbolic-(2, 2, 6, 5)-(2, 2, 2, 2)-{'auto_pad': 'SAME_LOWER', 'dilations': [2, 1]}]": "slow",
    "tests/portable/test_portable_lowering.py::test_conv_grad_with_same_padding_equals_torch[symbolic-(2, 3, 6, 5)-(4, 3, 3, 3)-{'auto_pad': 'SAME_UPPER'}]": "slow",
    "tests/portable/test_portable_modes.py::test_one_step_on_the_reference_evaluator_equals_onnxruntime": "slow",
    "tests/portable/test_portable_modes.py::test_the_cli_flag_takes_the_mode": "slow",
    "tests/portable/test_portable_modes.py::test_the_onnxruntime_mode_keeps_contrib_ops": "slow",
    "tests/portable/test_portable_optimizers.py::test_flat_buffers_give_the_per_tensor_update_bit_for_bit[adamw-torch-0.0-None]": "slow",
    "tests/portable/test_portable_optimizers.py::test_flat_buffers_give_the_per_tensor_update_bit_for_bit[adamw-torch-0.01-None]": "slow",
    "tests/portable/test_portable_optimizers.py::test_flat_buffers_give_the_per_tensor_update_bit_for_bit[adamw-torch-0.1-0.5]": "slow",
    "tests/portable/test_portable_runtime.py::test_a_run_moves_between_the_backends": "slow",
    "tests/portable/test_portable_runtime.py::test_a_sequence_optimizer_model_converted_offline_trains_like_a_regenerated_one": "slow",
    "tests/portable/test_portable_runtime.py::test_artifacts_of_the_sequence_layout_are_refused_with_the_command_that_regenerates_them": "slow",
    "tests/portable/test_portable_runtime.py::test_demo_trains_portable_artifacts_on_the_portable_backend": "slow",
    "tests/portable/test_portable_runtime.py::test_fit_takes_one_fused_step_per_batch": "slow",
    "tests/portable/test_portable_runtime.py::test_generated_portable_artifacts_follow_the_training_build": "slow",
    "tests/portable/test_portable_runtime.py::test_portable_accumulation_and_lazy_reset": "slow",
    "tests/portable/test_portable_runtime.py::test_portable_adamw_matches_torch": "slow",
    "tests/portable/test_portable_runtime.py::test_portable_resume_is_bit_exact": "slow",
    "tests/portable/test_portable_runtime.py::test_rewritten_ort_checkpoint_is_byte_identical_and_resumes_bit_exactly": "slow",
    "tests/portable/test_portable_runtime.py::test_the_portable_runtime_needs_no_graph_tooling": "slow",
    "tests/portable/test_portable_runtime_families.py::test_every_family_trains_on_stock_onnxruntime_like_torch": "py313 slow",
    "tests/portable/test_portable_runtime_py313.py": "py313",
    # project
    "tests/project/test_architecture.py::test_graph_surgery_lives_in_the_ir_layer": "slow",
    "tests/project/test_architecture.py::test_layers_import_only_downward": "slow",
    "tests/project/test_architecture.py::test_modules_fit_in_a_head": "slow",
    "tests/project/test_architecture.py::test_no_import_cycles": "slow",
    "tests/project/test_architecture.py::test_onnxruntime_has_one_door_and_torch_stays_in_its_module": "slow",
    "tests/project/test_clear_errors.py::test_a_learning_rate_that_is_not_one_names_the_argument": "slow",
    "tests/project/test_clear_errors.py::test_export_output_names_as_a_str_is_refused_not_iterated": "slow",
    "tests/project/test_clear_errors.py::test_fit_without_batches_names_the_argument": "slow",
    "tests/project/test_errors.py::test_every_deliberate_raise_is_an_onnxblocks_error": "slow",
    "tests/project/test_errors.py::test_every_exception_class_derives_from_onnxblocks_error": "slow",
    "tests/project/test_graph_names.py::test_contract_names_are_spelled_only_in_contracts": "slow",
    "tests/project/test_import_cycles.py::test_the_package_has_no_module_level_import_cycle": "slow",
    "tests/project/test_notebooks.py": "slow",
    "tests/project/test_numeric_comparisons.py": "slow",
    # runtime
    "tests/runtime/test_artifact_consistency.py::test_a_consistent_set_opens_and_trains_on_both_backends": "slow",
    "tests/runtime/test_artifact_consistency.py::test_a_file_of_another_generation_is_refused_when_the_session_opens[training-eval_model.onnx-from-wider]": "slow",
    "tests/runtime/test_artifact_set.py::test_loading_a_checkpoint_reads_the_checkpoint_only[portable]": "slow",
    "tests/runtime/test_artifact_set.py::test_opening_a_session_reads_each_artifact_file_once[portable]": "slow",
    "tests/runtime/test_artifact_set.py::test_the_set_is_checked_once_per_checkpoint[portable]": "slow",
    "tests/runtime/test_export.py::test_export_after_partial_fine_tuning[1-portable]": "slow",
    "tests/runtime/test_export.py::test_export_after_partial_fine_tuning[100-portable]": "slow",
    "tests/runtime/test_export.py::test_export_after_partial_fine_tuning[100-training]": "slow",
    "tests/runtime/test_export.py::test_export_over_2gb": "slow",
    "tests/runtime/test_export.py::test_export_replaces_an_earlier_export_without_leaving_its_data[portable]": "slow",
    "tests/runtime/test_ort_errors.py::test_run_failures_are_translated_once_on_both_backends[portable]": "slow",
    "tests/runtime/test_portable_lazy_sessions.py": "slow",
    "tests/runtime/test_runtime.py::test_accumulated_half_batches_equal_full_batch_with_half_mean_loss": "slow",
    "tests/runtime/test_runtime.py::test_accumulated_half_batches_equal_full_batch_with_sum_loss": "slow",
    "tests/runtime/test_runtime.py::test_checkpoint_round_trip_properties_and_optimizer_state": "slow",
    "tests/runtime/test_runtime.py::test_dict_batches_are_ordered_by_input_name": "slow",
    "tests/runtime/test_runtime.py::test_fit_accumulation_matches_manual_steps": "slow",
    "tests/runtime/test_runtime.py::test_import_is_lazy": "slow",
    "tests/runtime/test_runtime.py::test_learning_rate_set_matches_ort": "slow",
    "tests/runtime/test_runtime.py::test_parameter_access": "slow",
    "tests/runtime/test_runtime.py::test_plot_history_both_backends": "slow",
    "tests/runtime/test_runtime.py::test_png_plot": "slow",
    "tests/runtime/test_runtime.py::test_resume_continues_bit_for_bit": "slow",
    "tests/runtime/test_runtime.py::test_training_matches_ort_training_api": "slow",
    "tests/runtime/test_runtime_guards.py::test_ignore_index_is_still_accepted_after_the_batch_signature_passed[ce_ignore--100]": "slow",
    "tests/runtime/test_runtime_guards.py::test_labels_out_of_range_are_refused_after_the_batch_signature_passed[1000000000]": "slow",
    "tests/runtime/test_runtime_guards.py::test_two_dimensional_labels_after_the_batch_signature_passed": "slow",
    "tests/runtime/test_training_eval_lazy.py": "slow",
    # torch
    "tests/torch/test_einsum_memory.py": "slow",
    "tests/torch/test_torch_differential.py": "slow",
    "tests/torch/test_torch_distributed.py": "slow",
    "tests/torch/test_torch_extrema.py": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[cnn-dynamo]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[cnn-torchscript]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[gpt-dynamo]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[gpt-torchscript]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[lstm-dynamo]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[lstm-torchscript]": "slow",
    "tests/torch/test_torch_function.py::test_function_gradients_match_torch[two_heads-dynamo]": "slow",
    "tests/torch/test_torch_function.py::test_import_without_torch_says_what_to_install": "slow",
    "tests/torch/test_torch_function.py::test_module_holds_initializers_as_parameters": "slow",
    "tests/torch/test_torch_gradient_rewrites.py": "slow",
    "tests/torch/test_torch_module.py": "slow",
    "tests/torch/test_torch_module_api.py": "slow",
    "tests/torch/test_torch_upsample.py": "slow",
    "tests/torch/test_torchlib_registry.py": "slow",
    # web
    "tests/web/test_flat_step.py": "slow",
    "tests/web/test_flat_step.py::test_node_trains_the_flat_step_model_as_the_step_model": "node slow",
    "tests/web/test_inference_template.py": "slow",
    "tests/web/test_js_node.py::test_javascript_sources_type_check": "node",
    "tests/web/test_js_node.py::test_node_errors_say_what_to_do": "node",
    "tests/web/test_js_node.py::test_node_losses_equal_python_step_by_step": "node",
    "tests/web/test_js_node.py::test_node_losses_equal_stock_onnxruntime_on_python_313": "node py313",
    "tests/web/test_js_node.py::test_node_state_resumes_in_python_with_its_optimizer_state": "node",
    "tests/web/test_js_node.py::test_parameters_trained_in_node_load_back_into_python": "node",
    "tests/web/test_lora_browser.py": "browser",
    "tests/web/test_lora_node.py": "node",
    "tests/web/test_npm_package.py": "node",
    "tests/web/test_safetensors_offenders.py::test_javascript_names_the_same_offenders": "node",
    # the module server's shutdown waits for its half-second poll
    "tests/web/test_server_caching.py::test_an_unchanged_runtime_file_answers_not_modified": "slow",
    "tests/web/test_state_files.py::test_a_mutated_state_file_is_read_back_exactly_or_refused_naming_it": "slow",
    "tests/web/test_state_files.py::test_any_state_written_is_read_back_exactly_also_as_a_checkpoint": "slow",
    "tests/web/test_state_files.py::test_javascript_client_gives_the_same_verdicts_on_the_corpus": "node",
    "tests/web/test_tfjs_peer.py": "node browser slow",
    "tests/web/test_web_browser.py": "browser",
    "tests/web/test_webgpu_browser.py": "browser",
    "tests/web/test_webgpu_node.py": "node",
    "tests/web/test_web_state.py::test_load_state_sets_a_sessions_parameters_and_checks_them": "slow",
    "tests/web/test_web_state.py::test_state_back_to_a_checkpoint_resumes_exactly": "slow",
    "tests/web/test_web_state.py::test_the_server_serves_modules_and_wasm_with_their_types": "slow",
}

#: The markers :data:`MARKS` sets.
SELECTION_MARKERS = ("slow", "node", "browser", "py313")


def _pattern(key: str) -> re.Pattern[str]:
    body = ".*".join(re.escape(part) for part in key.split("*"))
    # a key that ends a file or a function name also matches what lies under it
    if not key.endswith("]") and "[" not in key:
        body += r"(?:(?:::|\[).*)?"
    return re.compile(body + r"\Z")


class MarkTable:
    """:data:`MARKS` compiled, looked up by file so a collection of thousands of tests stays quick."""

    def __init__(self, marks: dict[str, str] = MARKS) -> None:
        self._by_file: dict[str, list[tuple[str, re.Pattern[str], tuple[str, ...]]]] = defaultdict(
            list
        )
        for key, names in marks.items():
            unknown = set(names.split()) - set(SELECTION_MARKERS)
            if unknown:
                raise ValueError(
                    f"tests/support/markers.py: {key!r} sets unknown markers {unknown}"
                )
            self._by_file[key.split("::")[0]].append((key, _pattern(key), tuple(names.split())))
        self.used: set[str] = set()

    def markers(self, nodeid: str) -> list[str]:
        """The markers of the test ``nodeid`` (its keys are recorded in :attr:`used`)."""
        found: list[str] = []
        for key, pattern, names in self._by_file.get(nodeid.split("::")[0], ()):
            if pattern.match(nodeid):
                self.used.add(key)
                found += [name for name in names if name not in found]
        return found

    def unused(self, keys: Iterable[str] = MARKS) -> list[str]:
        """The keys that matched none of the tests looked up so far."""
        return [key for key in keys if key not in self.used]
