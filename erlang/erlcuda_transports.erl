%% @private
%% The size from which shared memory beats the pipe, measured on this machine.
%%
%% Which transport is faster for a vector of a given size depends on the machine: on some,
%% the files' fixed costs (each file operation is a call on a dirty I/O scheduler, each new
%% mapping page faults) outweigh the pipe's copies well past a megabyte; on others shared
%% memory wins from a few hundred KiB. With `shm_threshold' `auto' (the default), the port
%% owner runs this probe once the application's first worker is up and before the
%% application is ready: `vector_add' jobs, the shape of most jobs (two operands of the size
%% and a result of it), of sizes from ?MIN_SIZE to ?MAX_SIZE, each through the pipe and
%% through shared memory, a few of each, alternately, after a few of each unmeasured. (A
%% `copy' job, one operand and its result, runs the general path, whose costs through shared
%% memory differ from a kernel's: measured with it, the crossing fell a size too late.)
%% Shared memory is taken from where it crossed the pipe: between the last size the pipe
%% won and the next, from which shared memory was as fast at every larger size, where the
%% two differences meet (linearly), so that a size between the ones measured goes the faster
%% way. Where it won at every size, from the smallest; where the pipe won at every size,
%% from twice the largest (vectors of that size still go through shared memory: a long frame
%% in the pipe holds up every other job's). Later workers of the same start keep the figure,
%% or the default (1 MiB) where the probe failed. The jobs are quiet: neither counted nor
%% sent as telemetry.
-module(erlcuda_transports).

-export([start/1, run/0, run/1, choose/1, choose/2]).

-export_type([figure/0]).

%% A size and the median microseconds of a vector_add of it through the pipe and through
%% shared memory.
-type figure() :: {pos_integer(), non_neg_integer(), non_neg_integer()}.

-define(MIN_SIZE, 16384).
-define(MAX_SIZE, 16777216).
%% The sizes go up by this factor.
-define(STEP, 4).
-define(REPS, 5).
%% Jobs of each transport run first at each size, unmeasured: shared memory's first jobs of
%% a size make and register their files, which later jobs of that size reuse.
-define(WARMUP, 3).
%% Once shared memory has won at this many sizes in a row, larger ones are not measured.
-define(WINS, 2).
%% The probe stops measuring after this long, and chooses from the sizes it measured in
%% full: a job still out then is not waited for past it, so the probe ends within it, well
%% before the worker stops waiting for it (erlcuda_worker's MEASURE_MS).
-define(BUDGET_MS, 3000).
%% A job of the probe's that takes this long ends it: a worker that does not answer.
-define(JOB_TIMEOUT, 2000).

%% @doc Run the probe in a process of its own, which sends the port owner (`To')
%% `{erlcuda_transports, Ref, {ok, Threshold, Figures} | {error, Why}}'; the reference.
-spec start(pid()) -> reference().
start(To) ->
    Ref = make_ref(),
    _ = spawn(fun() -> To ! {erlcuda_transports, Ref, run()} end),
    Ref.

%% @doc Measure both transports at each size (see the module doc): the threshold and the
%% figures, or why it could not.
-spec run() -> {ok, pos_integer(), [figure()]} | {error, term()}.
run() ->
    run(?BUDGET_MS).

%% @doc `run/0' within `BudgetMs' milliseconds: the sizes measured in full by then;
%% `{error, no_figures}' where none was, `{error, {out_of_budget, Figures}}' where the
%% pipe still won the last of them.
-spec run(pos_integer()) -> {ok, pos_integer(), [figure()]} | {error, term()}.
run(BudgetMs) ->
    Data = binary:copy(<<1.0:32/float-little>>, ?MAX_SIZE div 4),
    Deadline = erlang:monotonic_time(millisecond) + BudgetMs,
    try sizes(Data, ?MIN_SIZE, Deadline, 0, []) of
        {[], _} ->
            {error, no_figures};
        {Figures, Ended} ->
            case choose(Figures, Ended) of
                {ok, Threshold} -> {ok, Threshold, Figures};
                {error, _} = Error -> Error
            end
    catch
        throw:{failed, Why} -> {error, Why}
    end.

%% The figures, and whether the sweep was `done' or `cut' by the budget.
sizes(_, Size, _, _, Acc) when Size > ?MAX_SIZE ->
    {lists:reverse(Acc), done};
sizes(_, _, _, ?WINS, Acc) ->
    {lists:reverse(Acc), done};
sizes(Data, Size, Deadline, Wins, Acc) ->
    Bin = binary:part(Data, 0, Size),
    try measure(Bin, Deadline) of
        {Pipe, Shm} ->
            Won = case Shm =< Pipe of true -> Wins + 1; false -> 0 end,
            sizes(Data, Size * ?STEP, Deadline, Won, [{Size, Pipe, Shm} | Acc])
    catch
        throw:out_of_budget -> {lists:reverse(Acc), cut}
    end.

%% Median microseconds through each transport, alternately, after ?WARMUP of each unmeasured.
measure(Bin, Deadline) ->
    _ = [add(Bin, T, Deadline) || _ <- lists:seq(1, ?WARMUP), T <- [pipe, shm]],
    Times = [{add(Bin, pipe, Deadline), add(Bin, shm, Deadline)} || _ <- lists:seq(1, ?REPS)],
    {median([P || {P, _} <- Times]), median([S || {_, S} <- Times])}.

%% @doc The threshold from the figures of a sweep `done', or `cut' short by the budget:
%% where the pipe won the last size of a cut sweep, the figures say nothing of where shared
%% memory starts to win (twice that size, `choose/1''s rule for a whole sweep the pipe won,
%% would be a guess), and `{error, {out_of_budget, Figures}}' says so.
-spec choose([figure(), ...], done | cut) ->
    {ok, pos_integer()} | {error, {out_of_budget, [figure()]}}.
choose(Figures, cut) ->
    case lists:last(lists:ukeysort(1, Figures)) of
        {_, Pipe, Shm} when Shm > Pipe -> {error, {out_of_budget, Figures}};
        _ -> {ok, choose(Figures)}
    end;
choose(Figures, done) ->
    {ok, choose(Figures)}.

%% @doc The threshold from the figures (see the module doc).
-spec choose([figure()]) -> pos_integer().
choose(Figures) ->
    Sorted = lists:ukeysort(1, Figures),  % one figure a size: the first
    {Largest, _, _} = lists:last(Sorted),
    {Lost, Won} = lists:splitwith(fun(F) -> not won_from(F, Sorted) end, Sorted),
    case {Lost, Won} of
        {_, []} -> Largest * 2;
        {[], [{Smallest, _, _} | _]} -> Smallest;
        {_, [First | _]} -> crossing(lists:last(Lost), First)
    end.

%% Shared memory was as fast at this size and every larger one.
won_from({Size, _, _}, Sorted) ->
    lists:all(fun({S, Pipe, Shm}) -> S < Size orelse Shm =< Pipe end, Sorted).

%% Where the difference between the transports crosses zero, between a size the pipe won
%% and the next, which shared memory won (linearly; in whole pages).
crossing({S0, Pipe0, Shm0}, {S1, Pipe1, Shm1}) ->
    D0 = Shm0 - Pipe0,
    D1 = Shm1 - Pipe1,
    At = S0 + (S1 - S0) * D0 / (D0 - D1),
    min(S1, 4096 * ceil(At / 4096)).

%% One quiet vector_add through `Transport': its microseconds. Waited for, its frame's
%% write included, until the probe's deadline at most (then `out_of_budget' is thrown), or
%% ?JOB_TIMEOUT where that comes first (a worker that does not answer: the probe fails).
add(Bin, Transport, Deadline) ->
    Now = erlang:monotonic_time(millisecond),
    Now < Deadline orelse throw(out_of_budget),
    Budget = Deadline =< Now + ?JOB_TIMEOUT,
    JobEnd = min(Deadline, Now + ?JOB_TIMEOUT),
    {ok, Job} = erlcuda_job:validate(vector_add, [Bin, Bin], [{format, binary},
                                                   {timeout, JobEnd - Now}]),
    Alias = alias([explicit_unalias]),
    T0 = erlang:monotonic_time(microsecond),
    Got = case erlcuda_submit:submit(Job#{transport => Transport, quiet => true,
                                          deadline => JobEnd}, Alias) of
              {ok, _, _} -> erlcuda_await:reply(Alias, JobEnd, none);
              {error, _} = Error -> Error
          end,
    T = erlang:monotonic_time(microsecond) - T0,
    case Got of
        {ok, {ok, Back}} when byte_size(Back) =:= byte_size(Bin) ->
            unalias(Alias),
            T;
        _ ->
            %% a reply that came as the wait ended goes with the alias
            ok = erlcuda_await:drop(Alias, 0, fun(_) -> ok end),
            throw(unanswered(Got, Budget))
    end.

%% A job not answered in time: cut off by the budget, or (its own timeout) a failure.
unanswered(timeout, true) -> out_of_budget;
unanswered({error, timeout}, true) -> out_of_budget;
unanswered(Got, _) -> {failed, Got}.

median(Values) ->
    lists:nth(length(Values) div 2 + 1, lists:sort(Values)).
