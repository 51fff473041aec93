%% The Erlang node of `bench/programs': programs timed from Erlang (see bench/programs.py).
%%
%% `main(ConfigFile)' reads one map (written by bench/programs.py), starts erlcuda with the
%% backend it names and writes one JSON object a line on stdout: `{"event":"result",...}'
%% per measurement (samples in nanoseconds, each one call's wall time in the caller),
%% `{"event":"rate",...}' for throughput, `{"event":"soak",...}' for memory readings,
%% `{"event":"info",...}' and `{"event":"done"}'.
%%
%% Cases, each on f32 vectors of `sizes':
%%   chain_program      10 chained vector_adds + reduce as one program on two device
%%                      buffers, answering the sum (fusion and graphs on: the default);
%%   chain_unfused      the same program made with {fuse, false}, {graph, false};
%%   chain_launches     the same chain as 11 launch_syncs on buffers ({keep, true}, the
%%                      intermediates freed), as before programs;
%%   chain_port         the program with its inputs as binaries and its sum as the answer,
%%                      beside vector_add_port, a lone vector_add of binaries (result as a
%%                      binary), in blocks of 25 calls alternating;
%%   one_step / launch  a one-step program (vector_add of two binaries) and a launch of
%%                      vector_add, alternating in blocks of 250 calls (1000 elements);
%% and, with `callers' > 0, `callers' processes each running a 3-step program
%% (s = a + b, t = s + b, sum t) on 1000-element inputs for `seconds', then the same work
%% as 3 launch_syncs each (programs or their equivalents per second); with `soak' > 0,
%% mixed programs for `soak' seconds, reading the worker's RSS and the device pool.
-module(erlcuda_programs_bench).

-export([main/1]).

-define(CHAIN, 10).
-define(BLOCK, 250).
%% A call's time at most: a reply that never came ends the run as an error, not a hang.
-define(CALL_MS, 120000).

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    erlcuda_bench_io:main(ConfigFile, fun run/1).

run(#{backend := Backend, python := Python} = Config) ->
    logger:set_primary_config(level, error),
    ok = application:load(erlcuda),
    ok = application:set_env(erlcuda, backend, Backend),
    ok = application:set_env(erlcuda, python, Python),
    {ok, _} = application:ensure_all_started(erlcuda),
    Info = erlcuda:info(),
    erlcuda_bench_io:emit(#{event => info, backend => maps:get(backend, Info),
                            devices => maps:get(devices, Info)}),
    Reps = maps:get(reps, Config),
    [sizes(N, Reps) || N <- maps:get(sizes, Config)],
    one_step(maps:get(lone_reps, Config, 2000)),
    callers(maps:get(callers, Config, 0), maps:get(seconds, Config, 5)),
    soak(maps:get(soak, Config, 0)),
    emit_programs().

%% -- the chain ------------------------------------------------------------------------------

chain_spec() ->
    Names = [list_to_atom("s" ++ integer_to_list(I)) || I <- lists:seq(1, ?CHAIN)],
    Steps = [{hd(Names), vector_add, [a, b]}
             | [{N, vector_add, [P, b]} || {P, N} <- lists:zip(lists:droplast(Names), tl(Names))]],
    #{name => chain, inputs => [a, b], steps => Steps ++ [{total, reduce, [lists:last(Names)]}],
      outputs => total}.

sizes(N, Reps0) ->
    Reps = max(20, Reps0 div max(1, N div 1000000)),
    A = vec(N, 1), B = vec(N, 2),
    {ok, HA} = erlcuda:upload(A, [{timeout, ?CALL_MS}]),
    {ok, HB} = erlcuda:upload(B, [{timeout, ?CALL_MS}]),
    Want = expected(N),
    {ok, Fused} = erlcuda:program(chain_spec()),
    {ok, Plain} = erlcuda:program(chain_spec(), [{fuse, false}, {graph, false}]),
    RunFused = runner(Fused, [HA, HB]),
    RunPlain = runner(Plain, [HA, HB]),
    check(RunPlain(), Want),
    warm_fused(RunFused, Want),
    time_case(chain_program, N, Reps, RunFused),
    time_case(chain_unfused, N, Reps, RunPlain),
    time_case(chain_launches, N, Reps, fun() -> chain_launches(HA, HB) end),
    check(chain_launches(HA, HB), Want),
    ok = erlcuda:free(HA), ok = erlcuda:free(HB),
    port_cases(N, Reps, Fused, A, B, Want).

runner(Program, Inputs) ->
    fun() -> {ok, S} = erlcuda:run_sync(Program, Inputs, [{timeout, ?CALL_MS}]), S end.

%% The fused kernel is compiled in the background (on a GPU): runs until the worker says it
%% ran fused, then a few more (the graph of the fused steps is captured on its second run).
warm_fused(Run, Want) ->
    Fuses = maps:get(backend, erlcuda:info()) =:= cuda,
    warm_fused(Run, Want, Fuses, erlang:monotonic_time(millisecond) + 600000).

warm_fused(Run, Want, Fuses, Deadline) ->
    check(Run(), Want),
    case not Fuses orelse fused_runs() > 0 of
        true ->
            [check(Run(), Want) || _ <- lists:seq(1, 5)],
            ok;
        false ->
            erlang:monotonic_time(millisecond) < Deadline orelse error(never_fused),
            timer:sleep(20),
            warm_fused(Run, Want, Fuses, Deadline)
    end.

fused_runs() ->
    #{device_info := [#{programs := #{fused_runs := F}} | _]} = erlcuda:info(),
    F.

chain_launches(HA, HB) ->
    {ok, First} = erlcuda:launch_sync(vector_add, [HA, HB], [{keep, true}]),
    Last = lists:foldl(fun(_, Prev) ->
                               {ok, Next} = erlcuda:launch_sync(vector_add, [Prev, HB],
                                                                [{keep, true}]),
                               ok = erlcuda:free(Prev),
                               Next
                       end, First, lists:seq(2, ?CHAIN)),
    {ok, Sum} = erlcuda:launch_sync(reduce, [Last], [{timeout, ?CALL_MS}]),
    ok = erlcuda:free(Last),
    Sum.

port_cases(N, Reps, Program, BA, BB, Want) ->
    Opts = [{timeout, ?CALL_MS}, {format, binary}],
    Prog = fun() -> {ok, S} = erlcuda:run_sync(Program, [BA, BB], Opts), S end,
    Add = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [BA, BB], Opts) end,
    check(Prog(), Want),
    blocks([{chain_port, Prog}, {vector_add_port, Add}], N, Reps, 25).

%% -- a lone job: a one-step program against a launch -----------------------------------------

one_step(Reps) ->
    A = vec(1000, 1), B = vec(1000, 2),
    {ok, P} = erlcuda:program(#{name => add, inputs => [a, b], steps => [{s, vector_add, [a, b]}],
                                outputs => s}),
    Opts = [{format, binary}],
    {ok, Same} = erlcuda:launch_sync(vector_add, [A, B], Opts),
    {ok, Same} = erlcuda:run_sync(P, [A, B], Opts),
    blocks([{one_step, fun() -> {ok, _} = erlcuda:run_sync(P, [A, B], Opts) end},
            {launch, fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [A, B], Opts) end}],
           1000, Reps, ?BLOCK).

%% Each case's calls in blocks of Block, the cases taking turns, until each has Reps.
blocks(Cases, N, Reps, Block) ->
    [F() || {_, F} <- Cases],  % warm
    Samples = lists:foldl(
                fun(_, Acc) ->
                        [{Name, timed(F, Block) ++ proplists:get_value(Name, Acc, [])}
                         || {Name, F} <- Cases]
                end, [], lists:seq(1, max(1, Reps div Block))),
    [emit(Name, N, S) || {Name, S} <- Samples].

%% -- many callers ----------------------------------------------------------------------------

callers(0, _) -> ok;
callers(Callers, Seconds) ->
    {ok, P} = erlcuda:program(#{name => three, inputs => [a, b],
                                steps => [{s, vector_add, [a, b]}, {t, vector_add, [s, b]},
                                          {u, reduce, [t]}], outputs => u}),
    A = vec(1000, 1), B = vec(1000, 2),
    Prog = fun() -> {ok, _} = erlcuda:run_sync(P, [A, B], [{timeout, ?CALL_MS}]) end,
    Three = fun() ->
                    Opts = [{timeout, ?CALL_MS}, {format, binary}],
                    {ok, S} = erlcuda:launch_sync(vector_add, [A, B], Opts),
                    {ok, T} = erlcuda:launch_sync(vector_add, [S, B], Opts),
                    {ok, _} = erlcuda:launch_sync(reduce, [T], Opts)
            end,
    Prog(), Three(),
    [rate(Name, Callers, Seconds, F) || {Name, F} <- [{programs, Prog}, {three_launches, Three},
                                                      {programs_again, Prog}]].

rate(Name, Callers, Seconds, F) ->
    Self = self(),
    Stop = erlang:monotonic_time(millisecond) + Seconds * 1000,
    Start = erlang:monotonic_time(nanosecond),
    Pids = [spawn_link(fun() -> Self ! {count, self(), loop(F, Stop, 0)} end)
            || _ <- lists:seq(1, Callers)],
    Done = lists:sum([receive {count, Pid, C} -> C end || Pid <- Pids]),
    Elapsed = erlang:monotonic_time(nanosecond) - Start,
    erlcuda_bench_io:emit(#{event => rate, 'case' => Name, callers => Callers, done => Done,
                            seconds => Elapsed / 1.0e9, per_second => Done / (Elapsed / 1.0e9)}).

loop(F, Stop, N) ->
    case erlang:monotonic_time(millisecond) < Stop of
        true -> F(), loop(F, Stop, N + 1);
        false -> N
    end.

%% -- memory over a soak of mixed programs ------------------------------------------------------

soak(0) -> ok;
soak(Seconds) ->
    Stop = erlang:monotonic_time(millisecond) + Seconds * 1000,
    Workers = [spawn_monitor(fun() -> exit({soaked, soak_loop(I, Stop, 0)}) end)
               || I <- lists:seq(1, 16)],
    sample_memory(Stop, 0),
    Ends = [receive {'DOWN', Ref, process, Pid, Why} -> Why end || {Pid, Ref} <- Workers],
    sample_once(Seconds),
    Runs = lists:sum([N || {soaked, N} <- Ends]),
    case [Why || Why <- Ends, element(1, Why) =/= soaked] of
        [] -> ok;
        [First | _] = Failed -> error({soak_failed, length(Failed), First})
    end,
    erlcuda_bench_io:emit(#{event => soak_done, runs => Runs, seconds => Seconds}).

%% Programs of several shapes and kinds, kept outputs freed, some run on buffers.
soak_loop(I, Stop, N) ->
    case erlang:monotonic_time(millisecond) < Stop of
        false -> N;
        true ->
            Size = lists:nth(1 + (N + I) rem 4, [10, 1000, 4096, 100000]),
            A = vec(Size, 1 + N rem 5), B = vec(Size, 1 + I rem 5),
            {ok, P} = erlcuda:program((chain_spec())#{outputs => [total, s3]},
                                      [{graph, (N rem 3) =/= 0}]),
            case N rem 2 of
                0 ->
                    {ok, [_, Buf]} = erlcuda:run_sync(P, [A, B], [{keep, true},
                                                                  {timeout, ?CALL_MS}]),
                    ok = erlcuda:free(Buf);
                1 ->
                    {ok, HA} = erlcuda:upload(A),
                    {ok, [_, _]} = erlcuda:run_sync(P, [HA, B], [{timeout, ?CALL_MS}]),
                    ok = erlcuda:free(HA)
            end,
            soak_loop(I, Stop, N + 1)
    end.

%% A reading every 5 s until Stop (monotonic milliseconds: they may be negative).
sample_memory(Stop, T) ->
    sample_once(T),
    case erlang:monotonic_time(millisecond) < Stop of
        true -> timer:sleep(5000), sample_memory(Stop, T + 5);
        false -> ok
    end.

sample_once(T) ->
    #{worker_os_pid := Os, device_info := Devices} = erlcuda:info(),
    [D | _] = Devices,
    erlcuda_bench_io:emit(#{event => soak, t => T, rss_kb => rss_kb(Os),
                            pool_bytes => maps:get(pool_bytes, D, 0),
                            free_memory => maps:get(free_memory, D, 0),
                            buffers => maps:get(buffers, D, 0),
                            graphs => maps:get(graphs, maps:get(programs, D, #{}), 0)}).

rss_kb(Os) ->
    case file:read_file("/proc/" ++ integer_to_list(Os) ++ "/status") of
        {ok, Text} ->
            case re:run(Text, "VmRSS:\\s+(\\d+)", [{capture, all_but_first, list}]) of
                {match, [Kb]} -> list_to_integer(Kb);
                nomatch -> 0
            end;
        _ -> 0
    end.

emit_programs() ->
    #{device_info := Devices} = erlcuda:info(),
    erlcuda_bench_io:emit(#{event => programs,
                            devices => [maps:get(programs, D, #{}) || D <- Devices]}).

%% -- helpers ---------------------------------------------------------------------------------

%% N f32 elements, element i being (i * K) rem 7: a pattern of 7 repeated.
vec(N, K) ->
    Period = << <<(float((I * K) rem 7)):32/float-little>> || I <- lists:seq(0, 6) >>,
    <<(binary:copy(Period, N div 7))/binary, (binary:part(Period, 0, 4 * (N rem 7)))/binary>>.

%% The chain's sum, sum(a + 10 b): a and b each run through 0..6 every 7 elements.
expected(N) ->
    Rest = lists:sum([float(I + ?CHAIN * ((2 * I) rem 7)) || I <- lists:seq(0, N rem 7 - 1)]),
    (N div 7) * (21.0 + ?CHAIN * 21.0) + Rest.

%% f32 sums of up to 1.6e7 terms, added as trees: well within 1e-5 of the exact one.
check(Got, Want) when abs(Got - Want) =< 1.0e-5 * abs(Want) + 1.0e-6 -> ok;
check(Got, Want) -> error({wrong_sum, Got, Want}).

time_case(Name, N, Reps, F) ->
    _ = F(),
    emit(Name, N, timed(F, Reps)).

timed(F, Reps) ->
    [begin
         T0 = erlang:monotonic_time(nanosecond),
         _ = F(),
         erlang:monotonic_time(nanosecond) - T0
     end || _ <- lists:seq(1, Reps)].

emit(Name, N, Samples) ->
    erlcuda_bench_io:emit(#{event => result, 'case' => Name, size => N, samples => Samples}).
