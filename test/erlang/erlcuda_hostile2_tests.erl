%% Hostile tests of protocol 3 (binary launch and results frames) and of the per-port writer
%% (erlcuda_writer). bug_* tests fail today because of the bug they name; holds_* tests check
%% promises that hold. CPU backend, the worker's test double (test/worker).
-module(erlcuda_hostile2_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

%% An atom no module knows: written here only as a string, never as an atom literal.
-define(NEVER_ATOM, "erlcuda_hostile2_never_an_atom").

%% These tests load the pipe and its writer with large operands: shared memory, which would
%% take those off the pipe, is off.
with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, [{shm_dir, none} | Env], Test).

%%% ---------------------------------------------------------------------------------------
%%% The writer
%%% ---------------------------------------------------------------------------------------

%%% ---------------------------------------------------------------------------------------
%%% launch_sync's {f32, Bin} path, traced jobs, telemetry
%%% ---------------------------------------------------------------------------------------

%% A launch_sync that times out while its vector result is on its way leaves nothing in the
%% mailbox, later either; non-finite vectors and scalars are {error, {non_finite, _}} in list
%% format and raw in binary format; the queue counters come back to 0.
holds_launch_sync_f32_timeout_and_non_finite_test_() ->
    with_app([], {timeout, 30, fun() ->
        erlcuda_test_util:stall(0, 800),
        V = binary:copy(<<1.5:32/float-little>>, 1000),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(vector_add, [V, V], [{timeout, 100}])),
        receive {stalled, {ok, _}} -> ok after 5000 -> error(no_stall) end,
        timer:sleep(300),
        no_message(),
        Big = [3.0e38, 3.0e38],
        ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(vector_add, [Big, Big])),
        ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(reduce, [Big])),
        {ok, Raw} = erlcuda:launch_sync(vector_add, [Big, Big], [{format, binary}]),
        ?assertEqual(<<0, 0, 128, 127, 0, 0, 128, 127>>, Raw),   % +inf twice
        {ok, Id} = erlcuda:launch(vector_add, [Big, Big]),
        ?assertMatch({error, {non_finite, _}}, receive {erlcuda, Id, R} -> R after 5000 -> lost end),
        ok = wait_until(fun() -> in_flight() =:= 0 end, 30),
        no_message()
    end}).

%%% ---------------------------------------------------------------------------------------
%%% What the port owner does per result
%%% ---------------------------------------------------------------------------------------

%%% ---------------------------------------------------------------------------------------
%%% A hostile worker's results frames
%%% ---------------------------------------------------------------------------------------
%%
%% The fake worker answers every control call (hello included) with a valid hello map and
%% answers each launch of reduce([S]) with the records of scenario S (see fake_worker/0).

%%% ---------------------------------------------------------------------------------------
%%% Helpers
%%% ---------------------------------------------------------------------------------------

in_flight() -> erlcuda_test_util:in_flight().

wait_until(Cond, N) -> erlcuda_test_util:wait_until(Cond, N).

no_message() -> erlcuda_test_util:no_message().

