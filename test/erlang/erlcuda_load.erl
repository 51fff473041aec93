%% @doc Load and fault generator: many processes launching mixed jobs, every reply checked.
%%
%% Used by erlcuda_app_tests (the test profile compiles test/erlang) and by `make soak'
%% (bench/soak compiles it into _build/soak); not part of the application. Each job's inputs
%% are vectors of one small integer value, so its exact result is known without computing
%% it; a reply is `right' when it equals that result, and every job must get exactly one
%% reply. `memory_soak/1' (`bench/soak --memory') is the same checking without faults, for
%% watching the worker's memory over a long steady load.
-module(erlcuda_load).

-export([run/1, soak/1, print/1, memory_soak/1, memory_failures/1, print_memory/1]).

-export_type([config/0, summary/0, sample/0, memory_summary/0]).

-type config() :: #{processes => pos_integer(),
                    jobs => pos_integer(),
                    window => pos_integer(),
                    max_size => pos_integer(),
                    kill_after_ms => non_neg_integer() | undefined}.
-type summary() :: #{jobs := non_neg_integer(),
                     replies := non_neg_integer(),
                     right := non_neg_integer(),
                     wrong := non_neg_integer(),
                     lost := non_neg_integer(),
                     duplicated := non_neg_integer(),
                     errors := #{term() => pos_integer()},
                     seconds := float(),
                     memory := map()}.
-type sample() :: #{elapsed_s := float(),
                    jobs := non_neg_integer(),
                    worker_os_pid := integer() | undefined,
                    worker_rss := non_neg_integer() | undefined,
                    worker_anon := non_neg_integer() | undefined,
                    worker_shmem := non_neg_integer() | undefined,
                    restarts := non_neg_integer() | undefined,
                    beam_total := non_neg_integer(),
                    job_table := non_neg_integer() | undefined}.
-type memory_summary() :: #{jobs := non_neg_integer(),
                            replies := non_neg_integer(),
                            right := non_neg_integer(),
                            wrong := non_neg_integer(),
                            lost := non_neg_integer(),
                            duplicated := non_neg_integer(),
                            errors := #{term() => pos_integer()},
                            seconds := float(),
                            samples := [sample()],
                            warmup_s := number(),
                            rss_start := non_neg_integer() | undefined,
                            rss_end := non_neg_integer() | undefined,
                            worker_os_pid := #{start := integer() | undefined,
                                               'end' := integer() | undefined},
                            restarts := non_neg_integer() | undefined}.

-define(REPLY_WAIT, 30000).
%% memory_soak/1: callers, jobs in flight per caller, seconds between samples, and the
%% warm-up after which the worker's allocator and buffer pools are taken to be at steady
%% state (so the first samples, which only show them filling, are not counted as growth).
-define(MEMORY_CALLERS, 200).
-define(MEMORY_WINDOW, 8).
-define(SAMPLE_S, 10).
-define(WARMUP_S, 60).
%% Results stay exact in f32 while every partial sum is an integer below 2^24.
-define(F32_EXACT, 16777216).

%% @doc Run one round: `processes' callers each launch `jobs' jobs, at most `window' of
%% them in flight per caller, on random devices; optionally SIGKILL the worker part-way.
-spec run(config()) -> summary().
run(Config0) ->
    Config = maps:merge(#{processes => 1000, jobs => 100, window => 8, max_size => 2000,
                          kill_after_ms => undefined}, Config0),
    #{processes := Procs, kill_after_ms := KillAfter} = Config,
    Before = memory(),
    T0 = erlang:monotonic_time(),
    Killer = [spawn(fun() -> timer:sleep(Ms), kill_worker() end) || is_integer(KillAfter),
                                                                   Ms <- [KillAfter]],
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {load_done, self(), caller(Config, C)} end)
            || C <- lists:seq(1, Procs)],
    Results = [receive {load_done, P, R} -> R end || P <- Pids],
    _ = [exit(K, kill) || K <- Killer],
    Seconds = erlang:convert_time_unit(erlang:monotonic_time() - T0, native, microsecond) / 1.0e6,
    collect_all(),
    After = memory(),
    Sum = lists:foldl(fun add/2, empty(), Results),
    Sum#{seconds => Seconds, memory => #{before => Before, 'after' => After}}.

%% @doc Rounds of load for `Seconds', every third one with the worker killed part-way;
%% prints and returns the totals.
-spec soak(pos_integer()) -> summary().
soak(Seconds) ->
    Deadline = erlang:monotonic_time(millisecond) + Seconds * 1000,
    Before = memory(),
    Total = soak_rounds(Deadline, 1, empty()),
    collect_all(),
    Summary = Total#{memory => #{before => Before, 'after' => memory()}},
    print(Summary),
    Summary.

soak_rounds(Deadline, Round, Acc) ->
    case erlang:monotonic_time(millisecond) < Deadline of
        false ->
            Acc;
        true ->
            Kill = case Round rem 3 of 0 -> 300; _ -> undefined end,
            %% each round starts with a worker that is up: a restart after a kill (which on
            %% a GPU compiles nothing but does create the contexts) is not a round of errors
            wait_up(100),
            R = run(#{processes => 200, jobs => 100, kill_after_ms => Kill}),
            io:format("round ~b~s: ~b jobs, ~b right, ~b errors, lost ~b, duplicated ~b, "
                      "~.1f s~n",
                      [Round, case Kill of undefined -> ""; _ -> " (worker killed)" end,
                       maps:get(jobs, R), maps:get(right, R),
                       lists:sum(maps:values(maps:get(errors, R))), maps:get(lost, R),
                       maps:get(duplicated, R), maps:get(seconds, R)]),
            soak_rounds(Deadline, Round + 1,
                        (add(R, Acc))#{seconds => maps:get(seconds, Acc) + maps:get(seconds, R)})
    end.

%% @doc A summary as a few readable lines.
-spec print(summary()) -> ok.
print(#{jobs := Jobs, replies := Replies, right := Right, wrong := Wrong, lost := Lost,
        duplicated := Dup, errors := Errors, memory := Memory} = S) ->
    io:format("jobs ~b, replies ~b, right ~b, wrong ~b, lost ~b, duplicated ~b in ~.1f s~n",
              [Jobs, Replies, Right, Wrong, Lost, Dup, maps:get(seconds, S, 0.0)]),
    io:format("errors by kind: ~p~n", [Errors]),
    #{before := B, 'after' := A} = Memory,
    io:format("memory before: node ~b MiB, worker ~p MiB; after: node ~b MiB, worker ~p MiB~n",
              [maps:get(node, B) bsr 20, mib(maps:get(worker, B)),
               maps:get(node, A) bsr 20, mib(maps:get(worker, A))]).

%% @doc A steady mixed load for `Seconds' with nothing killed: ?MEMORY_CALLERS callers,
%% every reply checked, and a sample of the worker's RSS, the node's memory and the job
%% table every ?SAMPLE_S seconds and at the end. Prints each sample as it is taken and the
%% summary; returns the summary.
-spec memory_soak(pos_integer()) -> memory_summary().
memory_soak(Seconds) ->
    wait_up(100),
    Start = worker_info(),
    Ctl = #{done => counters:new(1, [write_concurrency]), stop => atomics:new(1, [])},
    T0 = erlang:monotonic_time(millisecond),
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {load_done, self(), steady_caller(Ctl, C)} end)
            || C <- lists:seq(1, ?MEMORY_CALLERS)],
    print_sample_header(),
    Samples = [begin sleep_until(Tick), S = sample(T0, Ctl), print_sample(S), S end
               || Tick <- ticks(T0, T0 + Seconds * 1000)],
    %% the load stops only now, so that the last sample, like the others, sees it running
    atomics:put(maps:get(stop, Ctl), 1, 1),
    Results = [receive {load_done, P, R} -> R end || P <- Pids],
    Elapsed = (erlang:monotonic_time(millisecond) - T0) / 1000,
    End = worker_info(),
    Warmup = min(?WARMUP_S, Seconds div 2),
    Total = maps:remove(memory, lists:foldl(fun add/2, empty(), Results)),
    Summary = Total#{seconds => Elapsed,
                     samples => Samples,
                     warmup_s => Warmup,
                     rss_start => maps:get(worker_rss, after_warmup(Warmup, Samples)),
                     rss_end => maps:get(worker_rss, lists:last(Samples)),
                     worker_os_pid => #{start => maps:get(worker_os_pid, Start, undefined),
                                        'end' => maps:get(worker_os_pid, End, undefined)},
                     restarts => restarts(Start, End)},
    print_memory(Summary),
    Summary.

%% @doc What went wrong in a memory soak: jobs lost, answered twice or wrongly, jobs
%% neither answered nor counted lost, a worker restart; `[]' when nothing did.
-spec memory_failures(memory_summary()) -> [lost | duplicated | wrong | unaccounted
                                            | worker_restarted].
memory_failures(#{jobs := Jobs, replies := Replies, lost := Lost, duplicated := Dup,
                  wrong := Wrong, restarts := Restarts,
                  worker_os_pid := #{start := PidStart, 'end' := PidEnd}}) ->
    [lost || Lost > 0] ++ [duplicated || Dup > 0] ++ [wrong || Wrong > 0]
        ++ [unaccounted || Jobs =/= Replies + Lost]
        %% a restart count that could not be read is no proof of no restart
        ++ [worker_restarted || Restarts =/= 0 orelse PidStart =:= undefined
                                    orelse PidStart =/= PidEnd].

%% @doc A memory soak's summary as a few readable lines.
-spec print_memory(memory_summary()) -> ok.
print_memory(#{jobs := Jobs, replies := Replies, right := Right, wrong := Wrong, lost := Lost,
               duplicated := Dup, errors := Errors, seconds := Seconds, samples := Samples,
               warmup_s := Warmup, rss_start := RssStart, rss_end := RssEnd,
               worker_os_pid := #{start := PidStart, 'end' := PidEnd},
               restarts := Restarts} = S) ->
    io:format("~nworker RSS: start ~s MiB, end ~s MiB, growth ~s~n",
              [mib_text(RssStart), mib_text(RssEnd), growth(RssStart, RssEnd)]),
    io:format("  (start: the first sample at or after a ~b s warm-up, allowed for the "
              "allocator and buffer pools to reach steady state; end: the last sample, with "
              "the load still running)~n", [Warmup]),
    %% one sample to the next swings by tens of MiB: the spread tells growth from noise
    case [R || #{elapsed_s := T, worker_rss := R} <- Samples, T >= Warmup, is_integer(R)] of
        [] -> ok;
        Steady -> io:format("worker RSS after the warm-up: min ~s MiB, max ~s MiB~n",
                            [mib_text(lists:min(Steady)), mib_text(lists:max(Steady))])
    end,
    %% RSS counts the shared-memory pages the worker maps (the slots, Erlang's, bounded by
    %% its pool), once per mapping: its private memory is what a leak of its own would grow
    _ = [print_trend(What, Key, Warmup, Samples)
         || {What, Key} <- [{"worker RSS", worker_rss}, {"worker private (RssAnon)", worker_anon},
                            {"worker shared memory mapped (RssShmem)", worker_shmem},
                            {"BEAM total", beam_total}]],
    BeamStart = maps:get(beam_total, after_warmup(Warmup, Samples)),
    BeamEnd = maps:get(beam_total, lists:last(Samples)),
    io:format("BEAM total: start ~s MiB, end ~s MiB, growth ~s~n",
              [mib_text(BeamStart), mib_text(BeamEnd), growth(BeamStart, BeamEnd)]),
    io:format("jobs ~b in ~.1f s (~.1f jobs/s): replies ~b, right ~b, wrong ~b, lost ~b, "
              "duplicated ~b~n",
              [Jobs, Seconds, Jobs / max(Seconds, 0.001), Replies, Right, Wrong, Lost, Dup]),
    io:format("errors by kind: ~p~n", [Errors]),
    io:format("worker os pid: start ~p, end ~p; restarts ~p~n", [PidStart, PidEnd, Restarts]),
    case memory_failures(S) of
        [] -> io:format("result: ok~n");
        Failures -> io:format("result: FAILED ~p~n", [Failures])
    end.

print_sample_header() ->
    io:format("~10s ~10s ~15s ~15s ~10s ~11s ~16s ~16s~n",
              ["elapsed_s", "jobs", "worker_rss_MiB", "beam_total_MiB", "job_table",
               "worker_pid", "worker_anon_MiB", "worker_shmem_MiB"]).

print_sample(#{elapsed_s := T, jobs := Jobs, worker_rss := Rss, beam_total := Beam,
               job_table := Table, worker_os_pid := Pid, worker_anon := Anon,
               worker_shmem := Shmem}) ->
    io:format("~10.1f ~10b ~15s ~15s ~10w ~11w ~16s ~16s~n",
              [T, Jobs, mib_text(Rss), mib_text(Beam), Table, Pid, mib_text(Anon),
               mib_text(Shmem)]).

%% A figure's least-squares slope over the samples after the warm-up, and its means over
%% the first and the second half of them: growth told from the swings of one sample to the
%% next.
print_trend(What, Key, Warmup, Samples) ->
    case [{T / 60, V / 1048576} || #{elapsed_s := T, Key := V} <- Samples, T >= Warmup,
                                   is_integer(V)] of
        Points when length(Points) >= 4 ->
            {First, Second} = lists:split(length(Points) div 2, Points),
            Slope = slope(Points),
            io:format("~s, trend after the warm-up: ~s~.2f MiB a minute (least squares); mean ~.1f "
                      "MiB in the first half, ~.1f in the second~n",
                      [What, sign(Slope), Slope, mean(First), mean(Second)]);
        _ ->
            ok
    end.

slope(Points) ->
    N = length(Points),
    Mx = lists:sum([X || {X, _} <- Points]) / N,
    My = mean(Points),
    case lists:sum([(X - Mx) * (X - Mx) || {X, _} <- Points]) of
        Sxx when Sxx > 0 -> lists:sum([(X - Mx) * (Y - My) || {X, Y} <- Points]) / Sxx;
        _ -> 0.0
    end.

mean(Points) ->
    lists:sum([Y || {_, Y} <- Points]) / length(Points).

mib_text(undefined) -> "?";
mib_text(Bytes) -> io_lib:format("~.1f", [Bytes / 1048576]).

growth(From, To) when is_integer(From), is_integer(To), From > 0 ->
    io_lib:format("~s~.1f MiB (~s~.1f %)",
                  [sign(To - From), (To - From) / 1048576, sign(To - From),
                   (To - From) * 100 / From]);
growth(_, _) ->
    "?".

sign(D) when D >= 0 -> "+";
sign(_) -> "".

%% Every ?SAMPLE_S seconds from the start, and the deadline itself.
ticks(T0, Deadline) ->
    Step = ?SAMPLE_S * 1000,
    [T0 + I * Step || I <- lists:seq(0, (Deadline - T0 - 1) div Step)] ++ [Deadline].

sleep_until(Ms) ->
    timer:sleep(max(0, Ms - erlang:monotonic_time(millisecond))).

sample(T0, #{done := Done}) ->
    Info = worker_info(),
    Pid = maps:get(worker_os_pid, Info, undefined),
    #{elapsed_s => (erlang:monotonic_time(millisecond) - T0) / 1000,
      jobs => counters:get(Done, 1),
      worker_os_pid => Pid,
      worker_rss => status_kb(Pid, "VmRSS"),
      worker_anon => status_kb(Pid, "RssAnon"),
      worker_shmem => status_kb(Pid, "RssShmem"),
      restarts => maps:get(restarts, Info, undefined),
      beam_total => erlang:memory(total),
      job_table => ets:info(erlcuda_jobs, size)}.

after_warmup(Warmup, Samples) ->
    case [S || #{elapsed_s := T} = S <- Samples, T >= Warmup] of
        [First | _] -> First;
        [] -> lists:last(Samples)
    end.

restarts(#{restarts := From}, #{restarts := To}) when is_integer(From), is_integer(To) ->
    To - From;
restarts(_, _) ->
    undefined.

worker_info() ->
    try erlcuda:info() catch _:_ -> #{} end.

wait_up(0) ->
    ok;
wait_up(N) ->
    case catch erlcuda:info() of
        #{worker_status := up} -> ok;
        _ -> timer:sleep(100), wait_up(N - 1)
    end.

mib(undefined) -> undefined;
mib(Bytes) -> Bytes bsr 20.

empty() ->
    #{jobs => 0, replies => 0, right => 0, wrong => 0, lost => 0, duplicated => 0,
      errors => #{}, seconds => 0.0, memory => #{}}.

add(A, B) ->
    maps:merge(B, #{jobs => maps:get(jobs, A) + maps:get(jobs, B),
                    replies => maps:get(replies, A) + maps:get(replies, B),
                    right => maps:get(right, A) + maps:get(right, B),
                    wrong => maps:get(wrong, A) + maps:get(wrong, B),
                    lost => maps:get(lost, A) + maps:get(lost, B),
                    duplicated => maps:get(duplicated, A) + maps:get(duplicated, B),
                    errors => maps:fold(fun(K, V, Acc) -> maps:update_with(K, fun(X) -> X + V end,
                                                                           V, Acc)
                                        end, maps:get(errors, B), maps:get(errors, A))}).

%% One caller: launch, keep at most Window in flight, check each reply against its job.
caller(#{jobs := Jobs, window := Window, max_size := MaxSize}, C) ->
    _ = rand:seed(exsss, {C, erlang:unique_integer(), 7}),
    Devices = devices(),
    loop(Jobs, Window, MaxSize, Devices, #{}, (empty())#{jobs => Jobs}).

loop(0, _, _, _, Open, Acc) when map_size(Open) =:= 0 ->
    stray(Acc);
loop(Left, Window, MaxSize, Devices, Open, Acc) when Left > 0, map_size(Open) < Window ->
    {Kernel, Args, Expected} = job(MaxSize),
    case erlcuda:launch(Kernel, Args, [{device, device(Devices)}]) of
        {ok, Id} -> loop(Left - 1, Window, MaxSize, Devices, Open#{Id => Expected}, Acc);
        %% an error returned by launch itself is that job's one reply
        {error, Why} -> loop(Left - 1, Window, MaxSize, Devices, Open,
                             bump(replies, failed(Why, Acc)))
    end;
loop(Left, Window, MaxSize, Devices, Open, Acc) ->
    receive
        {erlcuda, Id, Result} ->
            case maps:take(Id, Open) of
                {Expected, Rest} ->
                    loop(Left, Window, MaxSize, Devices, Rest, check(Result, Expected, Acc));
                error ->
                    loop(Left, Window, MaxSize, Devices, Open, bump(duplicated, Acc))
            end
    after ?REPLY_WAIT ->
        %% every job still open is lost: count them and give up on this caller
        loop(0, Window, MaxSize, Devices, #{},
             Acc#{lost => maps:get(lost, Acc) + map_size(Open)})
    end.

%% Replies that come after a caller has no job open: each one is a job answered twice.
stray(Acc) ->
    receive {erlcuda, _, _} -> stray(bump(duplicated, Acc))
    after 100 -> Acc
    end.

%% `any' or one of the devices, evenly.
device(Devices) ->
    case rand:uniform(Devices + 1) of 1 -> any; N -> N - 2 end.

%% One reply counted against the job's exact result.
check(Result, Expected, Acc) ->
    Acc1 = case Result of
               {ok, Expected} -> bump(right, Acc);
               {ok, _} -> bump(wrong, Acc);
               {error, Why} -> failed(Why, Acc)
           end,
    bump(replies, Acc1).

bump(Key, Acc) -> Acc#{Key => maps:get(Key, Acc) + 1}.

failed(Why, Acc) ->
    Kind = case Why of {K, _} -> K; K -> K end,
    Acc#{errors => maps:update_with(Kind, fun(X) -> X + 1 end, 1, maps:get(errors, Acc))}.

%% Vectors of one small integer value: every result is exact in f32.
job(MaxSize) ->
    V = float(rand:uniform(50)),
    case rand:uniform(4) of
        1 ->
            S = rand:uniform(MaxSize),
            A = vec(V, S),
            {vector_add, [A, A], lists:duplicate(S, 2 * V)};
        2 ->
            S = rand:uniform(MaxSize) - 1,
            {reduce, [vec(V, S)], S * V};
        3 ->
            S = rand:uniform(MaxSize) - 1,
            A = vec(V, S),
            {dot_product, [A, A], S * V * V};
        4 ->
            [M, N, K] = [rand:uniform(8) || _ <- [m, n, k]],
            {matmul, [vec(V, M * K), vec(1.0, K * N), M, N, K], lists:duplicate(M * N, K * V)}
    end.

vec(V, S) -> binary:copy(<<V:32/float-little>>, S).

%% One memory-soak caller: until told to stop, a quarter of its jobs through launch_sync,
%% the rest through launch/3 with at most ?MEMORY_WINDOW in flight; then the open ones
%% answered. Every reply also counts in `done', which the sampler reads.
steady_caller(Ctl, C) ->
    _ = rand:seed(exsss, {C, erlang:unique_integer(), 7}),
    steady(Ctl#{devices => devices()}, #{}, empty()).

steady(#{stop := Stop} = Ctx, Open, Acc) ->
    case {atomics:get(Stop, 1) =:= 0, map_size(Open)} of
        {true, N} when N < ?MEMORY_WINDOW ->
            {Open1, Acc1} = launch_mixed(Ctx, Open, bump(jobs, Acc)),
            steady(Ctx, Open1, Acc1);
        {false, 0} ->
            stray(Acc);
        _ ->
            receive
                {erlcuda, Id, Result} ->
                    case maps:take(Id, Open) of
                        {Expected, Rest} ->
                            steady(Ctx, Rest, replied(Ctx, check(Result, Expected, Acc)));
                        error ->
                            steady(Ctx, Open, bump(duplicated, Acc))
                    end
            after ?REPLY_WAIT ->
                %% every job still open is lost: count them and give up on this caller
                stray(Acc#{lost => maps:get(lost, Acc) + map_size(Open)})
            end
    end.

launch_mixed(#{devices := Devices} = Ctx, Open, Acc) ->
    {Kernel, Args, Format, Expected} = mixed_job(),
    Opts = [{device, device(Devices)}, {format, Format}],
    case rand:uniform(4) of
        1 ->
            case erlcuda:launch_sync(Kernel, Args, [{timeout, ?REPLY_WAIT} | Opts]) of
                {error, timeout} -> {Open, bump(lost, Acc)};
                Result -> {Open, replied(Ctx, check(Result, Expected, Acc))}
            end;
        _ ->
            case erlcuda:launch(Kernel, Args, Opts) of
                {ok, Id} -> {Open#{Id => Expected}, Acc};
                %% an error returned by launch itself is that job's one reply
                {error, Why} -> {Open, replied(Ctx, bump(replies, failed(Why, Acc)))}
            end
    end.

replied(#{done := Done}, Acc) ->
    counters:add(Done, 1, 1),
    Acc.

%% All four kernels at sizes spread evenly over 1 to 1e5 elements on a log scale, now and
%% then 1e6; inputs as lists or binaries, vector results in either format. The value is
%% kept small enough for the size that every sum stays exact in f32.
mixed_job() ->
    Format = case rand:uniform(2) of 1 -> list; 2 -> binary end,
    case rand:uniform(4) of
        1 ->
            S = mixed_size(),
            V = value(50),
            A = input(V, S),
            {vector_add, [A, A], Format, vector(2 * V, S, Format)};
        2 ->
            S = mixed_size(),
            V = value((?F32_EXACT - 1) div S),
            {reduce, [input(V, S)], Format, S * V};
        3 ->
            S = mixed_size(),
            V = value(trunc(math:sqrt((?F32_EXACT - 1) div S))),
            A = input(V, S),
            {dot_product, [A, A], Format, S * V * V};
        4 ->
            [M, N, K] = [log_uniform(2.5) || _ <- [m, n, k]],
            V = value(50),
            {matmul, [input(V, M * K), input(1.0, K * N), M, N, K], Format,
             vector(K * V, M * N, Format)}
    end.

mixed_size() ->
    case rand:uniform(500) of 1 -> 1000000; _ -> log_uniform(5) end.

%% 1 to 10^Decades, evenly spread over the decades.
log_uniform(Decades) ->
    round(math:pow(10, Decades * rand:uniform_real())).

value(Max) -> float(rand:uniform(max(1, min(50, Max)))).

%% A list input costs the caller a conversion per element: up to 1e5 of them.
input(V, S) when S =< 100000 ->
    case rand:uniform(4) of 1 -> lists:duplicate(S, V); _ -> vec(V, S) end;
input(V, S) ->
    vec(V, S).

vector(X, S, list) -> lists:duplicate(S, X);
vector(X, S, binary) -> vec(X, S).

devices() ->
    try erlcuda:info() of #{devices := N} -> max(N, 1) catch _:_ -> 1 end.

%% The pid from the status table, not info/0: a call to the port owner, which a loaded
%% node may answer too late.
kill_worker() ->
    case erlcuda_status:worker_os_pid() of
        Pid when is_integer(Pid) ->
            os:cmd("kill -9 " ++ integer_to_list(Pid));
        _ ->
            ok
    end.

%% Every process's garbage collected, so that a memory figure counts what is held, not what
%% waits for a collection (whose amount depends on how the schedulers happened to run).
collect_all() ->
    _ = [garbage_collect(P) || P <- processes()],
    ok.

memory() ->
    Worker = try erlcuda:info() of
                 #{worker_os_pid := Pid} when is_integer(Pid) -> rss(Pid);
                 _ -> undefined
             catch _:_ -> undefined
             end,
    #{node => erlang:memory(total), worker => Worker}.

%% Resident memory of an OS process, from /proc (Linux); undefined elsewhere.
rss(Pid) ->
    status_kb(Pid, "VmRSS").

%% A field of an OS process's /proc status, in kB, as bytes; undefined where there is none.
status_kb(Pid, Field) when is_integer(Pid) ->
    case file:read_file("/proc/" ++ integer_to_list(Pid) ++ "/status") of
        {ok, Status} ->
            case re:run(Status, Field ++ ":\\s+(\\d+) kB", [{capture, all_but_first, list}]) of
                {match, [Kb]} -> list_to_integer(Kb) * 1024;
                nomatch -> undefined
            end;
        _ ->
            undefined
    end;
status_kb(_, _) ->
    undefined.
