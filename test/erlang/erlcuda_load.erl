%% @doc Load and fault generator: many processes launching mixed jobs, every reply checked.
%%
%% Used by the reliability tests (the test profile compiles test/erlang) and by `make soak'
%% (bench/soak compiles it into _build/soak); not part of the application. Each job's inputs
%% are vectors of one small integer value, so its exact result is known without computing
%% it; a reply is `right' when it equals that result, and every job must get exactly one
%% reply.
-module(erlcuda_load).

-export([run/1, soak/1, print/1]).

-export_type([config/0, summary/0]).

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

-define(REPLY_WAIT, 30000).

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
    garbage_collect(),
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
    garbage_collect(),
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
    receive {erlcuda, _, _} -> Acc#{duplicated => maps:get(duplicated, Acc) + 1}
    after 100 -> Acc
    end;
loop(Left, Window, MaxSize, Devices, Open, Acc) when Left > 0, map_size(Open) < Window ->
    {Kernel, Args, Expected} = job(MaxSize),
    Device = case rand:uniform(Devices + 1) of 1 -> any; N -> N - 2 end,
    case erlcuda:launch(Kernel, Args, [{device, Device}]) of
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
                    Acc1 = case Result of
                               {ok, Expected} -> bump(right, Acc);
                               {ok, _} -> bump(wrong, Acc);
                               {error, Why} -> failed(Why, Acc)
                           end,
                    loop(Left, Window, MaxSize, Devices, Rest, bump(replies, Acc1));
                error ->
                    loop(Left, Window, MaxSize, Devices, Open, bump(duplicated, Acc))
            end
    after ?REPLY_WAIT ->
        %% every job still open is lost: count them and give up on this caller
        loop(0, Window, MaxSize, Devices, #{},
             Acc#{lost => maps:get(lost, Acc) + map_size(Open)})
    end.

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

devices() ->
    try erlcuda:info() of #{devices := N} -> max(N, 1) catch _:_ -> 1 end.

kill_worker() ->
    case erlcuda:info() of
        #{worker_os_pid := Pid} when is_integer(Pid) ->
            os:cmd("kill -9 " ++ integer_to_list(Pid));
        _ ->
            ok
    end.

memory() ->
    Worker = try erlcuda:info() of
                 #{worker_os_pid := Pid} when is_integer(Pid) -> rss(Pid);
                 _ -> undefined
             catch _:_ -> undefined
             end,
    #{node => erlang:memory(total), worker => Worker}.

%% Resident memory of an OS process, from /proc (Linux); undefined elsewhere.
rss(Pid) ->
    case file:read_file("/proc/" ++ integer_to_list(Pid) ++ "/status") of
        {ok, Status} ->
            case re:run(Status, "VmRSS:\\s+(\\d+) kB", [{capture, all_but_first, list}]) of
                {match, [Kb]} -> list_to_integer(Kb) * 1024;
                nomatch -> undefined
            end;
        _ ->
            undefined
    end.
