%% The transports' probe (erlcuda_transports): the threshold it chooses from its figures, and the
%% probe run by the application's first start with `shm_threshold' auto: quiet jobs (not
%% counted), a threshold in effect from then on, kept by later workers; none with a
%% threshold set, or without shared memory; and a probe that holds to its budget.
-module(erlcuda_transports_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"},
                   {python_path, []}, {shm_dir, auto}, {shm_threshold, 1048576}]).

%% Shared memory from where it crossed the pipe, between the last size the pipe won and the
%% next (from which shared memory was as fast at every larger size), in whole pages; from
%% the smallest where it always won; twice the largest where the pipe always won.
choose_test() ->
    K = 1024,
    ?assertEqual(256 * K, erlcuda_transports:choose([{64 * K, 10, 20}, {256 * K, 30, 30},
                                                 {1024 * K, 90, 50}])),
    %% 256 KiB: 10 us slower; 1 MiB: 40 us faster: they meet a fifth of the way
    ?assertEqual(4096 * 103, erlcuda_transports:choose([{1024 * K, 90, 50}, {64 * K, 10, 5},
                                                    {256 * K, 30, 40}])),
    ?assertEqual(64 * K, erlcuda_transports:choose([{64 * K, 10, 5}, {256 * K, 30, 20}])),
    %% a size given twice counts once (its first figure): 10 us slower, then 5 faster
    ?assertEqual(192 * K, erlcuda_transports:choose([{64 * K, 10, 20}, {64 * K, 10, 5},
                                                 {256 * K, 10, 5}])),
    ?assertEqual(2048 * K, erlcuda_transports:choose([{64 * K, 10, 50}, {1024 * K, 90, 91}])).

probed_at_start_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [{shm_threshold, auto}], {timeout, 120, fun() ->
        #{shm_threshold := T, shm_figures := Figures, jobs := Jobs,
          worker_os_pid := Old} = erlcuda:info(),
        ?assertNotEqual([], Figures),
        Sizes = [S || {S, _, _} <- Figures],
        ?assert(T >= lists:min(Sizes) andalso T =< 2 * lists:max(Sizes)),
        ?assertEqual(T, erlcuda_transports:choose(Figures)),
        ?assertMatch(#{submitted := 0, ok := 0, error := 0}, Jobs),  % quiet
        %% but answered, for the node's rate: busy and answering nothing is a slow node
        ?assert(erlcuda_jobs:answered() >= 2 * length(Figures)),
        ?assertMatch(#{status := up, shm := #{threshold := T}}, erlcuda_status:status()),
        %% a later worker keeps the figure, measured once
        erlcuda_test_util:kill9(Old),
        erlcuda_test_util:wait_restarted(Old, 100),
        ?assertMatch(#{shm_threshold := T, shm_figures := Figures}, erlcuda:info())
    end}).

not_probed_test_() ->
    [erlcuda_test_util:with_app(?DEFAULTS, Env, {timeout, 60, fun() ->
         #{shm_threshold := T, shm_figures := Figures} = erlcuda:info(),
         ?assertEqual([], Figures),
         ?assertEqual(Want, T)
     end}) || {Env, Want} <- [{[{shm_threshold, 4096}], 4096},
                              {[{shm_threshold, auto}, {shm_dir, none}], none}]].

%% A probe whose budget runs out while a job is out stops waiting for it then: with the
%% device busy past the budget it ends with no figure, where it waited out its jobs'
%% timeout and failed (`timeout').
budget_test_() ->
    erlcuda_test_util:with_app(
      ?DEFAULTS, [{worker_module, "erlcuda_testworker"},
                  {python_path, erlcuda_test_util:test_worker_path()}],
      {timeout, 60, fun() ->
           ok = erlcuda_test_util:stall(0, 4000),
           ?assertEqual({error, no_figures}, erlcuda_transports:run(300)),
           erlcuda_test_util:flush_stalled(),
           erlcuda_test_util:no_message()  % the reply of the job cut off never comes here
       end}).

%% A sweep cut short by the budget where the pipe won its last size says nothing of where
%% shared memory wins: no threshold (the worker keeps its default), where a whole sweep's
%% rule would have taken twice that size. Cut after shared memory won, it chooses as ever.
choose_cut_test() ->
    K = 1024,
    PipeWon = [{16 * K, 249, 316}, {64 * K, 300, 400}],
    ?assertEqual({error, {out_of_budget, PipeWon}}, erlcuda_transports:choose(PipeWon, cut)),
    ?assertEqual({ok, 128 * K}, erlcuda_transports:choose(PipeWon, done)),
    ShmWon = [{16 * K, 100, 200}, {64 * K, 300, 250}],
    ?assertEqual({ok, erlcuda_transports:choose(ShmWon)},
                 erlcuda_transports:choose(ShmWon, cut)).
