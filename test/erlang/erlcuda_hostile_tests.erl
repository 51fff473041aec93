%% A hostile review of the Erlang side: each test named bug_* shows a defect and fails on
%% the code it was written against; each test named holds_* checks a promise that held.
%% CPU backend, the worker's test double (test/worker). Sub-nodes are used where the
%% defect aborts the whole VM.
-module(erlcuda_hostile_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).
%% keys some tests set that are not in ?DEFAULTS: unset after each test
-define(EXTRA, [telemetry_module]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%%% Defects.

%%% Promises that held.

%% Bad input of any shape: a documented {error, Reason} from launch and launch_sync alike,
%% never an exception; the service goes on, no stray message, the counters stay at 0.
holds_hostile_input_test_() ->
    with_app([], fun() ->
        Big = 1 bsl 1000,
        Cases =
            [{unknown_kernel, self(), [[1.0]], []},
             {unknown_kernel, <<"reduce">>, [[1.0]], []},
             {unknown_kernel, "reduce", [[1.0]], []},
             {bad_args, reduce, #{a => 1}, []},
             {bad_args, reduce, [[1.0] | x], []},
             {bad_args, reduce, [[1.0, [2.0]]], []},
             {bad_args, reduce, [[<<1.0:32/float>>]], []},
             {bad_args, reduce, [[Big]], []},
             {bad_args, reduce, [[-Big]], []},
             {bad_args, reduce, [[3.5e38]], []},
             {bad_args, reduce, [[340282356779733661637539395458142568448]], []},
             {bad_args, reduce, [<<1:7>>], []},
             {bad_args, reduce, [{1.0}], []},
             {bad_args, matmul, [[1.0], [1.0], true, 1, 1], []},
             {bad_args, matmul, [[1.0], [1.0], 1, 1, 1 bsl 200], []},
             {bad_args, matmul, [<<>>, <<>>, 0, 0, 1 bsl 31], []},
             {bad_args, matmul, [[], [], -1, 0, 0], []},
             {bad_device, reduce, [[1.0]], [{device, 1 bsl 64}]},
             {bad_device, reduce, [[1.0]], [{device, 2}]},
             {bad_device, reduce, [[1.0]], [{device, "0"}]},
             {bad_option, reduce, [[1.0]], {device, 0}},
             {bad_option, reduce, [[1.0]], [{device, 0} | {}]},
             {bad_option, reduce, [[1.0]], [{format, <<"binary">>}]},
             {bad_option, reduce, [[1.0]], [{trace, 1}]},
             {bad_option, reduce, [[1.0]], [{timeout, -1}]},
             {bad_option, reduce, [[1.0]], [{timeout, 1.5}]},
             {bad_option, reduce, [[1.0]], [{timeout, 1 bsl 32}]},
             {bad_option, reduce, [[1.0]], [{device, 0, extra}]},
             {bad_option, reduce, [[1.0]], [device]},
             {bad_option, reduce, [[1.0]], [[]]},
             {bad_option, reduce, [[1.0]], #{"device" => 0}},
             {bad_option, reduce, [[1.0]], #{device => any, bogus => 1}}],
        lists:foreach(
          fun({Tag, Kernel, Args, Opts} = Case) ->
                  Async = (catch erlcuda:launch(Kernel, Args, Opts)),
                  Sync = (catch erlcuda:launch_sync(Kernel, Args, Opts)),
                  ?assertEqual({Case, Async}, {Case, Sync}),
                  ?assertMatch({_, {error, {Tag, _}}}, {Case, Async})
          end, Cases),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], #{device => any})),
        ?assertEqual({ok, <<>>}, erlcuda:launch_sync(vector_add, [[], <<>>],
                                                     [{format, binary}])),
        timer:sleep(100),
        no_message(),
        ?assertEqual({0, 0}, {in_flight(), erlcuda_jobs:size()})
    end).

%% launch_sync's timeout: no late reply reaches the caller, also with trace; the job's
%% entry and queue place go once the late reply comes.
holds_no_stray_after_timeout_test_() ->
    with_app([], {timeout, 20, fun() ->
        erlcuda_test_util:stall(0, 500),
        ?assertEqual({error, timeout}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 0}])),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 20}, {trace, true}])),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(reduce, [[1.0]], #{timeout => 50, device => 0})),
        flush_stalled(),
        timer:sleep(300),
        no_message(),
        ?assertEqual({0, 0}, {in_flight(), erlcuda_jobs:size()})
    end}).

%%% Helpers.

is_reply({ok, _}) -> true;
is_reply({error, _}) -> true;
is_reply(_) -> false.

in_flight() -> erlcuda_test_util:in_flight().

wait_until(_, 0) -> timeout;
wait_until(Cond, N) ->
    case catch Cond() of
        true -> ok;
        _ -> timer:sleep(100), wait_until(Cond, N - 1)
    end.

flush_stalled() ->
    receive {stalled, _} -> ok after 6000 -> ok end.

flush() ->
    receive M -> [M | flush()] after 0 -> [] end.

no_message() -> erlcuda_test_util:no_message().
