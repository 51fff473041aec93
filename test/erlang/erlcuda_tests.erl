%% The Erlang API on the CPU backend with two virtual devices: results, bad input of any
%% shape, options as lists and maps, timeouts (and no stray reply after one), traced
%% launch_sync, a killed worker and many concurrent callers.
-module(erlcuda_tests).

-include_lib("eunit/include/eunit.hrl").

-define(TOL, 1.0e-4).

defaults() ->
    [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"},
     {python_path, erlcuda_test_util:test_worker_path()}].

setup() ->
    application:load(erlcuda),
    _ = [ok = application:set_env(erlcuda, K, V) || {K, V} <- defaults()],
    {ok, _} = application:ensure_all_started(erlcuda),
    ok.

cleanup(_) ->
    ok = application:stop(erlcuda).

erlcuda_test_() ->
    {setup, fun setup/0, fun cleanup/1,
     [{"vector_add", fun vector_add/0},
      {"reduce", fun reduce/0},
      {"dot_product", fun dot_product/0},
      {"matmul", fun matmul/0},
      {"binary in and out", fun binary_format/0},
      {"integers are numbers", fun integers/0},
      {"empty vectors", fun empty/0},
      {"async launch replies once", fun async/0},
      {"device routing", fun devices/0},
      {"a large vector", {timeout, 60, fun large/0}},
      {"bad input gets a clear error, then service goes on", fun bad_input/0},
      {"info", fun info/0},
      {"timeout leaves no stray message", {timeout, 20, fun timeout_no_stray/0}},
      {"killed worker: in-flight jobs fail, worker restarts", {timeout, 60, fun killed_worker/0}},
      {"concurrent callers get their own replies in order", {timeout, 60, fun concurrent/0}},
      {"a busy port's launches go through its writer, batched", {timeout, 60, fun writer/0}}]}.

%% Without shared memory, so that every large operand goes through the pipe's writer.
erlcuda_pipe_test_() ->
    erlcuda_test_util:with_app(defaults(), [{shm_dir, none}],
                               [{"callers of large jobs wait for the writer, not pile up",
                                 {timeout, 60, fun writer_bound/0}}]).

close(A, B) when is_list(A), is_list(B) ->
    length(A) =:= length(B) andalso lists:all(fun({X, Y}) -> close(X, Y) end, lists:zip(A, B));
close(A, B) when is_number(A), is_number(B) ->
    abs(A - B) =< ?TOL * max(1.0, abs(B)).

rand_vec(N) -> [rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)].

vector_add() ->
    A = rand_vec(1000), B = rand_vec(1000),
    {ok, C} = erlcuda:launch_sync(vector_add, [A, B]),
    ?assert(close(C, [X + Y || {X, Y} <- lists:zip(A, B)])).

reduce() ->
    A = rand_vec(777),
    {ok, S} = erlcuda:launch_sync(reduce, [A]),
    ?assert(is_float(S)),
    ?assert(close(S, lists:sum(A))).

dot_product() ->
    A = rand_vec(513), B = rand_vec(513),
    {ok, D} = erlcuda:launch_sync(dot_product, [A, B]),
    ?assert(close(D, lists:sum([X * Y || {X, Y} <- lists:zip(A, B)]))).

matmul() ->
    {M, N, K} = {3, 4, 5},
    A = rand_vec(M * K), B = rand_vec(K * N),
    {ok, C} = erlcuda:launch_sync(matmul, [A, B, M, N, K]),
    Expected = [lists:sum([lists:nth(I * K + P + 1, A) * lists:nth(P * N + J + 1, B)
                           || P <- lists:seq(0, K - 1)])
                || I <- lists:seq(0, M - 1), J <- lists:seq(0, N - 1)],
    ?assert(close(C, Expected)).

binary_format() ->
    A = << <<X:32/float-little>> || X <- [1.0, 2.0, 3.0] >>,
    B = << <<X:32/float-little>> || X <- [0.5, 0.25, 0.125] >>,
    {ok, C} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}]),
    ?assertEqual(<< <<X:32/float-little>> || X <- [1.5, 2.25, 3.125] >>, C),
    %% a binary and a list mix
    {ok, L} = erlcuda:launch_sync(vector_add, [A, [1, 1, 1]]),
    ?assertEqual([2.0, 3.0, 4.0], L).

integers() ->
    ?assertEqual({ok, 6.0}, erlcuda:launch_sync(reduce, [[1, 2, 3]])),
    ?assertEqual({ok, [19.0, 22.0, 43.0, 50.0]},
                 erlcuda:launch_sync(matmul, [[1, 2, 3, 4], [5, 6, 7, 8], 2, 2, 2])).

empty() ->
    ?assertEqual({ok, []}, erlcuda:launch_sync(vector_add, [[], []])),
    ?assertEqual({ok, 0.0}, erlcuda:launch_sync(reduce, [[]])),
    ?assertEqual({ok, 0.0}, erlcuda:launch_sync(dot_product, [<<>>, <<>>])),
    ?assertEqual({ok, []}, erlcuda:launch_sync(matmul, [[], [], 0, 0, 0])),
    ?assertEqual({ok, [0.0, 0.0]}, erlcuda:launch_sync(matmul, [[], [], 2, 1, 0])).

async() ->
    {ok, Id} = erlcuda:launch(reduce, [[1.0, 2.5]]),
    ?assert(is_integer(Id)),
    receive {erlcuda, Id, R} -> ?assertEqual({ok, 3.5}, R)
    after 5000 -> error(no_reply)
    end,
    receive {erlcuda, Id, _} -> error(duplicate) after 200 -> ok end.

devices() ->
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, 1}])),
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, any}])),
    #{device_info := [D0, D1]} = erlcuda:info(),
    ?assert(maps:get(jobs, D1) >= 1),
    ?assert(maps:get(jobs, D0) >= 0).

large() ->
    N = 4000000,
    A = << <<(float(I rem 1000)):32/float-little>> || I <- lists:seq(1, N) >>,
    {ok, C} = erlcuda:launch_sync(vector_add, [A, A], [{format, binary}, {timeout, 30000}]),
    ?assertEqual(N * 4, byte_size(C)),
    <<First:32/float-little, _/binary>> = C,
    ?assertEqual(2.0, First),
    {ok, S} = erlcuda:launch_sync(reduce, [A], [{timeout, 30000}]),
    ?assert(close(S, float((N div 1000) * (999 * 1000 div 2)))).

bad_input() ->
    Cases = [
        {{unknown_kernel, fft}, fft, [[1.0]], []},
        {{unknown_kernel, "vector_add"}, "vector_add", [[1.0], [1.0]], []},
        {{bad_device, 7}, reduce, [[1.0]], [{device, 7}]},
        {{bad_device, -1}, reduce, [[1.0]], [{device, -1}]},
        {{bad_device, gpu0}, reduce, [[1.0]], [{device, gpu0}]},
        {{bad_option, {colour, red}}, reduce, [[1.0]], [{colour, red}]},
        {{bad_option, {format, json}}, reduce, [[1.0]], [{format, json}]},
        {{bad_option, not_a_list}, reduce, [[1.0]], not_a_list},
        {bad_args, vector_add, [[1.0, 2.0], [1.0]], []},
        {bad_args, vector_add, [[1.0, foo], [1.0, 2.0]], []},
        {bad_args, vector_add, [[1.0], [1.0], [1.0]], []},
        {bad_args, vector_add, [[1.0]], []},
        {bad_args, vector_add, not_a_list, []},
        {bad_args, reduce, [<<1, 2, 3>>], []},
        {bad_args, reduce, [{1.0}], []},
        {bad_args, reduce, [[1.0 | 2.0]], []},
        {bad_args, reduce, [[1.0e300]], []},
        {bad_args, dot_product, [[1.0], [1.0, 2.0]], []},
        {bad_args, matmul, [[1.0], [1.0], 1, 1], []},
        {bad_args, matmul, [[1.0, 2.0], [1.0], 1, 1, 1], []},
        {bad_args, matmul, [[1.0], [1.0], 1, 1, 2], []},
        {bad_args, matmul, [[1.0], [1.0], -1, -1, -1], []},
        {bad_args, matmul, [[1.0], [1.0], 1.0, 1, 1], []},
        {too_large, matmul, [[], [], 100000, 100000, 0], []}
    ],
    lists:foreach(
      fun({Expected, Kernel, Args, Opts}) ->
              Got = erlcuda:launch(Kernel, Args, Opts),
              ?assertEqual(Got, erlcuda:launch_sync(Kernel, Args, Opts)),
              case {Expected, Got} of
                  {bad_args, {error, {bad_args, Why}}} -> ?assert(is_binary(Why));
                  _ -> ?assertEqual({error, Expected}, Got)
              end,
              ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
      end, Cases).

info() ->
    Info = erlcuda:info(),
    ?assertMatch(#{backend := cpu, devices := 2, worker_os_pid := P} when is_integer(P), Info),
    #{device_info := Devices} = Info,
    ?assertEqual(2, length(Devices)),
    [?assertMatch(#{jobs := _, launches := _, max_batch := _, queue := _, in_flight := _}, D)
     || D <- Devices].

timeout_no_stray() ->
    erlcuda_test_util:stall(0, 600),
    ?assertEqual({error, timeout}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 50}])),
    timer:sleep(1000),
    receive {erlcuda, _, _} = Stray -> error({stray, Stray}) after 0 -> ok end,
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]])).

killed_worker() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    erlcuda_test_util:stall(0, 5000),
    Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[1.0]]), Id end || _ <- lists:seq(1, 20)],
    os:cmd("kill -9 " ++ integer_to_list(Pid)),
    [receive {erlcuda, Id, R} -> ?assertMatch({error, {worker_down, _}}, R)
     after 5000 -> error({no_reply, Id})
     end || Id <- Ids],
    erlcuda_test_util:wait_restarted(Pid, 300),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]])),
    receive {erlcuda, _, _} = Dup -> error({duplicate, Dup}) after 300 -> ok end.

concurrent() ->
    Self = self(),
    Callers = 50, Jobs = 20,
    Pids = [spawn_link(fun() -> Self ! {done, self(), caller(C, Jobs)} end)
            || C <- lists:seq(1, Callers)],
    Results = [receive {done, P, R} -> R after 30000 -> error(caller_hung) end || P <- Pids],
    ?assertEqual(lists:duplicate(Callers, ok), Results).

%% Each caller launches jobs whose results encode (caller, sequence number), then checks it
%% receives exactly its own results, and per device in the order launched.
caller(C, Jobs) ->
    Launched = [begin
                    Dev = J rem 2,
                    {ok, Id} = erlcuda:launch(reduce, [[float(C), float(J)]], [{device, Dev}]),
                    {Id, Dev, float(C + J)}
                end || J <- lists:seq(1, Jobs)],
    %% in arrival order: any reply, not a selective receive
    Arrived = [receive {erlcuda, Id, {ok, V}} -> {Id, V}
               after 10000 -> error(no_reply)
               end || _ <- Launched],
    Expected = maps:from_list([{Id, V} || {Id, _, V} <- Launched]),
    Expected = maps:from_list(Arrived),
    Order = [Id || {Id, _} <- Arrived],
    lists:foreach(fun(Dev) ->
                          InOrder = [Id || {Id, D, _} <- Launched, D =:= Dev],
                          InOrder = [Id || Id <- Order, dev(Id, Launched) =:= Dev]
                  end, [0, 1]),
    receive {erlcuda, _, _} = Extra -> error({extra, Extra}) after 0 -> ok end,
    ok.

%% 200 callers of 4 KiB jobs (under any shared-memory threshold: their frames carry their
%% data) keep the port busy: their frames go through the port's writer, several to a batch
%% frame, and every caller still gets its own results, in order. The worker is stopped while
%% they start, so that the port is busy whatever the machine's speed.
writer() ->
    #{writer := #{jobs := Before}, worker_os_pid := Os} = erlcuda:info(),
    erlcuda_test_util:signal(Os, "STOP"),
    Self = self(),
    N = 1024,
    Pids = [spawn_link(fun() ->
                               V = binary:copy(<<(float(C)):32/float-little>>, N),
                               Ids = [begin {ok, Id} = erlcuda:launch(reduce, [V]), Id end
                                      || _ <- lists:seq(1, 10)],
                               Got = [receive {erlcuda, Id, R} -> R after 20000 -> lost end
                                      || Id <- Ids],
                               Self ! {done, self(), Got =:= lists:duplicate(10, {ok, float(C * N)}) orelse {C, Got}}
                       end) || C <- lists:seq(1, 200)],
    timer:sleep(300),
    erlcuda_test_util:signal(Os, "CONT"),
    ?assertEqual(lists:duplicate(200, true),
                 [receive {done, P, Ok} -> Ok after 30000 -> error(caller_hung) end || P <- Pids]),
    #{writer := #{jobs := After, frames := Frames}} = erlcuda:info(),
    ?debugFmt("writer: ~b jobs in ~b batch frames", [After - Before, Frames]),
    ?assert(After - Before > 0),
    ?assert(Frames < After).

%% 100 callers launching 1 MiB jobs through the pipe as fast as they can for two seconds:
%% what waits in the node stays bounded (the writer holds at most 64 MiB; callers past that wait; without
%% that bound this reached a GiB within half a second and went on growing).
writer_bound() ->
    Mb = binary:copy(<<1.0:32/float-little>>, 1 bsl 18),
    %% a fresh binary a job, as real callers have
    Loop = fun Loop() -> _ = erlcuda:launch(reduce, [binary:copy(Mb)]), Loop() end,
    Callers = [spawn(Loop) || _ <- lists:seq(1, 100)],
    Peak = binary_peak(Callers, 20, 0),
    [exit(C, kill) || C <- Callers],
    ?debugFmt("binary memory peak with 100 callers of 1 MiB jobs: ~b MiB", [Peak bsr 20]),
    ?assert(Peak < 800 bsl 20),
    wait_drained(100).

%% The most binary memory held in N samples 100 ms apart; stops early past 1 GiB. For each
%% sample the callers are held still and every process's garbage collected, so it counts
%% what is held at that moment (by callers, writers, the port) and not the binaries that
%% wait for a collection, whose amount depends only on how the schedulers happened to run.
binary_peak(_, 0, Peak) -> Peak;
binary_peak(_, _, Peak) when Peak > 1 bsl 30 -> Peak;
binary_peak(Callers, N, Peak) ->
    timer:sleep(100),
    _ = [erlang:suspend_process(C) || C <- Callers],
    _ = [erlang:garbage_collect(P) || P <- processes()],
    Held = erlang:memory(binary),
    _ = [erlang:resume_process(C) || C <- Callers],
    binary_peak(Callers, N - 1, max(Peak, Held)).

wait_drained(0) -> error(jobs_left);
wait_drained(N) ->
    case erlcuda_jobs:size() of
        0 -> ok;
        _ -> timer:sleep(100), wait_drained(N - 1)
    end.

dev(Id, Launched) ->
    {Id, Dev, _} = lists:keyfind(Id, 1, Launched),
    Dev.

non_finite_test_() ->
    {setup, fun setup/0, fun cleanup/1,
     fun() ->
             Big = [3.0e38, 3.0e38],
             ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(vector_add, [Big, Big])),
             ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(reduce, [Big])),
             Inf = <<0, 0, 128, 127>>,
             ?assertEqual({ok, <<Inf/binary, Inf/binary>>},
                          erlcuda:launch_sync(vector_add, [Big, Big], [{format, binary}])),
             ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]]))
     end}.

%% info/0 answers within its own bound even while the worker's control thread is busy.
info_while_busy_test_() ->
    {setup, fun setup/0, fun cleanup/1,
     {timeout, 20, fun() ->
         Self = self(),
         spawn(fun() -> Self ! {stalled, erlcuda_worker:call(stall, [0, 4000], 9000)} end),
         timer:sleep(100),
         %% answered with this side's view, before the stalled worker answered
         Info = erlcuda:info(),
         ?assertMatch(#{backend := cpu, worker_answered := false, devices := 2}, Info),
         receive {stalled, _} -> ok after 9000 -> error(stall) end,
         ?assertNot(maps:is_key(worker_answered, erlcuda:info()))
     end}}.

%%% launch/3 and launch_sync/3 against bad input of any shape, options in every form, timeouts
%%% and traced jobs, in a fixture of their own (the worker's test double, two devices).

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%% Bad input of any shape: a documented {error, Reason} from launch and launch_sync alike,
%% never an exception; the service goes on, no stray message, the counters stay at 0.
hostile_input_test_() ->
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
no_stray_after_timeout_test_() ->
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

%% A launch_sync that times out while its vector result is on its way leaves nothing in the
%% mailbox, later either; non-finite vectors and scalars are {error, {non_finite, _}} in list
%% format and raw in binary format; the queue counters come back to 0. (Shared memory off: the
%% result comes through the {f32, Bin} path of the pipe.)
launch_sync_f32_timeout_and_non_finite_test_() ->
    with_app([{shm_dir, none}], {timeout, 30, fun() ->
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
        ok = erlcuda_test_util:wait_until(fun() -> in_flight() =:= 0 end, 30),
        no_message()
    end}).

%% launch_sync checks an f32 list's range while the worker runs the job: a number beyond
%% it, in any argument, at any place, fails the call with the error launch/3 gives at once
%% (traced or not, its result kept or not); the job's reply never reaches the mailbox, and
%% nothing stays behind (no job, nothing in flight, no buffer kept).
range_checked_while_the_job_runs_test_() ->
    with_app([], {timeout, 30, fun() ->
        Base = buffer_usage(),
        Ok = [float(I) || I <- lists:seq(1, 40)],
        Bad = fun(P, X) -> lists:sublist(Ok, P) ++ [X | lists:nthtail(P + 1, Ok)] end,
        Cases = [{vector_add, [Bad(P, X), Ok]} || P <- [0, 9, 39], X <- [1.0e39, -1 bsl 200]]
            ++ [{vector_add, [Ok, Bad(17, -1.0e39)]}, {reduce, [Bad(5, 4.0e38)]},
                {dot_product, [Ok, Bad(39, 1.0e39)]}],
        lists:foreach(
          fun({K, Args}) ->
                  {error, {bad_args, _}} = Want = erlcuda:launch(K, Args),
                  ?assertEqual({K, Want}, {K, erlcuda:launch_sync(K, Args)}),
                  ?assertEqual({K, Want},
                               {K, erlcuda:launch_sync(K, Args, [{format, binary}])}),
                  %% as a launch refused before it is submitted: no stamps
                  ?assertEqual({K, Want},
                               {K, erlcuda:launch_sync(K, Args, [{trace, true}])})
          end, Cases),
        %% long enough that the reply may come before the check ends (shared memory too)
        Long = lists:duplicate(300000, 0.5),
        LongBad = Long ++ [1.0e39],
        ?assertEqual(erlcuda:launch(vector_add, [LongBad, [1.0 | Long]]),
                     erlcuda:launch_sync(vector_add, [LongBad, [1.0 | Long]])),
        %% whatever else is wrong, the first bad argument in order is named, as launch/3
        %% names it: ranges in both, a range before a type, a length or a count
        F64 = element(2, erlcuda:upload([1.0], [{type, f64}])),
        Mixed = [{vector_add, [[1.0e39], [2.0e39]]}, {vector_add, [[1.0e39], [foo]]},
                 {vector_add, [[1.0e39], [1.0, 2.0]]}, {vector_add, [[1.0e39], <<1, 2, 3>>]},
                 {vector_add, [[], [1.0e39]]}, {vector_add, [[1.0e39, foo], [1.0, 2.0]]},
                 {vector_add, [[1.0e39 | foo], [1.0]]}, {matmul, [[1.0e39], [1.0], -1, 1, 1]},
                 {vector_add, [[1.0e39], [1 bsl 2000]]}],
        [?assertEqual({K, As, erlcuda:launch(K, As)}, {K, As, erlcuda:launch_sync(K, As)})
         || {K, As} <- Mixed],
        ?assertEqual(erlcuda:launch(vector_add, [[1.0e39], F64], [{type, f32}]),
                     erlcuda:launch_sync(vector_add, [[1.0e39], F64], [{type, f32}])),
        ok = erlcuda:free(F64),
        Kept = [Bad(3, 1.0e39), Ok],
        ?assertEqual(erlcuda:launch(vector_add, Kept),
                     erlcuda:launch_sync(vector_add, Kept, [{keep, true}])),
        ?assertMatch({ok, [_ | _]}, erlcuda:launch_sync(vector_add, [Ok, Ok])),
        timer:sleep(300),
        no_message(),
        ok = erlcuda_test_util:wait_until(fun() -> in_flight() =:= 0 end, 30),
        ?assertEqual(0, erlcuda_jobs:size()),
        ok = erlcuda_test_util:wait_until(fun() -> buffer_usage() =:= Base end, 300)
    end}).

buffer_usage() ->
    #{device_info := Devices, owned_buffers := Owned} = erlcuda:info(),
    {[maps:get(buffers, D) || D <- Devices], Owned}.

%% launch_sync with {trace, true} answers with the stamps beside the result, also for an
%% error, and leaves nothing in the mailbox. The stamps are nanoseconds by stage, each
%% timed on one clock (they mixed the worker's perf_counter readings with a monotonic
%% reading of Erlang's, which no reader could set against each other).
traced_launch_sync_test_() ->
    with_app([], fun() ->
        {ok, 3.0, Stamps} = erlcuda:launch_sync(reduce, [[1.0, 2.0]],
                                                [{trace, true}, {timeout, 5000}]),
        ?assertEqual([<<"backend">>, <<"decode">>, <<"encode">>, <<"forward">>, <<"group">>,
                      <<"queue">>], lists:sort(maps:keys(Stamps))),
        ?assert(lists:all(fun(Ns) -> is_integer(Ns) andalso Ns >= 0 end, maps:values(Stamps))),
        Big = [3.0e38, 3.0e38],
        {error, {non_finite, _}, Failed} = erlcuda:launch_sync(vector_add, [Big, Big],
                                                               [{trace, true}]),
        ?assertMatch(#{<<"decode">> := _, <<"forward">> := _}, Failed),
        ?assert(lists:all(fun(Ns) -> is_integer(Ns) andalso Ns >= 0 end, maps:values(Failed))),
        no_message()
    end).

%% {timeout, T} above 4294967295 is refused as a bad option before anything is submitted (a
%% timer that large would raise timeout_value after submitting, and the reply land in the
%% mailbox later).
timeout_out_of_range_test_() ->
    with_app([], fun() ->
        Big = 4294967296,
        ?assertEqual({error, {bad_option, {timeout, Big}}},
                     erlcuda:launch_sync(reduce, [[1.0]], [{timeout, Big}])),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 4294967295}])),
        timer:sleep(200),
        no_message()
    end).

%% Improper lists as arguments or options are bad_args / bad_option (never badarg or
%% function_clause), and options may be given as a map.
improper_lists_and_map_options_test_() ->
    with_app([], fun() ->
        ?assertMatch({error, {bad_args, _}}, erlcuda:launch(vector_add, [[1] | foo])),
        ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(reduce, [[1.0] | [[2.0] | x]])),
        ?assertMatch({error, {bad_option, _}}, erlcuda:launch(reduce, [[1.0]], [{device, 0} | bad])),
        ?assertMatch({error, {bad_option, _}},
                     erlcuda:launch_sync(reduce, [[1.0]], [{format, list} | {device, 0}])),
        ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], #{device => 1})),
        ?assertEqual({ok, <<3.0:32/float-little>>},
                     erlcuda:launch_sync(vector_add, [[1.0], [2.0]],
                                         #{format => binary, timeout => 1000})),
        ?assertEqual({error, {bad_option, {colour, red}}},
                     erlcuda:launch(reduce, [[1.0]], #{colour => red})),
        no_message()
    end).

in_flight() -> erlcuda_test_util:in_flight().

no_message() -> erlcuda_test_util:no_message().

flush_stalled() -> erlcuda_test_util:flush_stalled().
