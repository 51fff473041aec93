%% @private
%% A caller's wait for its job's one reply.
%%
%% launch_sync, local and remote alike: the reply comes through a process alias made for
%% the one call, so nothing else in the mailbox can match it; once the wait ends the alias
%% is dropped, and a reply that slipped in before that is taken out, so a late result never
%% reaches the caller.
%%
%% erlcuda:await/2, for a `launch' of this node: the reply names the job id (ids are never
%% issued twice). The waiting process claims the job's stop event (erlcuda_jobs:claim/1),
%% and when its time runs out it drops the job if it is still registered, so that no reply
%% ever comes after `{error, timeout}'; one answered meanwhile has its reply on the way,
%% which is taken and returned (within ?LATE_MS).
-module(erlcuda_await).

-export([deadline/1, remaining/1, reply/3, drop/3, result/1, message/1, job/2, answered/2,
         take/2, spin_us/3]).

%% How long a lone job's caller polls its mailbox with `caller_spin_us' `auto': longer
%% than a small job's round trip on a GPU, so that its reply finds the caller awake.
-define(AUTO_SPIN_US, 200).
%% `auto' spins only on a host with at least this many cores: the spinning caller holds one,
%% and the worker, the port owner and the reply's scheduler need theirs. With fewer, the
%% spin takes the core the worker needs to answer, and every lone job waits it out.
-define(AUTO_SPIN_MIN_CORES, 4).

%% How long a job answered as the wait ended may take to arrive: its reply was sent, or is
%% read from a shared-memory file (by the file's part process, or a deliverer).
-define(LATE_MS, 5000).

-export_type([deadline/0]).

-type deadline() :: integer() | infinity.

%% @doc The monotonic millisecond by which a wait of `Timeout' ms ends.
-spec deadline(timeout()) -> deadline().
deadline(infinity) -> infinity;
deadline(Ms) -> erlang:monotonic_time(millisecond) + Ms.

%% @doc What is left of a wait that ends at `Deadline', for `receive ... after'.
-spec remaining(deadline()) -> timeout().
remaining(infinity) -> infinity;
remaining(Deadline) -> max(Deadline - erlang:monotonic_time(millisecond), 0).

%% @doc The reply through `Alias', as launch_sync returns it, until `Deadline'. With the
%% monitor `Mon' of the process that is to send it (a proxy on another node), its 'DOWN'
%% ends the wait too, and a result it holds (`held': one that names buffers, which it gives
%% once told it is taken) is one more answer; `none' for a local job.
%%
%% A local job's caller first polls its mailbox for a while (`spin_us/3'), yielding between
%% looks: a scheduler that has gone to sleep costs a wake-up when the reply comes, more than
%% a small job takes on a GPU.
-spec reply(reference(), deadline(), reference() | none) ->
    {ok, term()} | {held, pid(), tuple()} | {down, term()} | timeout.
reply(Alias, Deadline, none) ->
    Setting = application:get_env(erlcuda, caller_spin_us, auto),
    InFlight = case Setting of
                   auto -> erlcuda_status:in_flight();
                   _ -> 0
               end,
    case spin_us(Setting, InFlight, cores()) of
        0 -> wait(Alias, Deadline, none);
        Us -> spin(Alias, Deadline, spin_until(Us, Deadline))
    end;
reply(Alias, Deadline, Mon) ->
    wait(Alias, Deadline, Mon).

%% @doc How long a caller polls for its reply: `caller_spin_us' where it is a number;
%% with `auto', ?AUTO_SPIN_US while its job is the one in flight (`InFlight' jobs on the
%% worker's devices, its own among them) on a host of `Cores' cores that has one to spare
%% (?AUTO_SPIN_MIN_CORES), else not at all: a lone caller's wait is mostly the wake-up the
%% spin saves, and many callers' spinning would take the schedulers their replies need. So
%% at most about one caller a node spins, for ?AUTO_SPIN_US at most.
-spec spin_us(auto | non_neg_integer(), non_neg_integer(), pos_integer()) ->
    non_neg_integer().
spin_us(auto, InFlight, Cores) when InFlight =< 1, Cores >= ?AUTO_SPIN_MIN_CORES ->
    ?AUTO_SPIN_US;
spin_us(auto, _, _) -> 0;
spin_us(Us, _, _) when is_integer(Us), Us >= 0 -> Us;
spin_us(_, _, _) -> 0.

%% The cores this node may use: those the OS lets it run on (its schedulers where the OS
%% does not say), and no more than its CPU quota (a container's `--cpus'), which the
%% affinity mask does not show.
cores() ->
    Available = case erlang:system_info(logical_processors_available) of
                    unknown -> erlang:system_info(schedulers_online);
                    N -> N
                end,
    case erlang:system_info(cpu_quota) of
        unknown -> Available;
        Quota -> min(Available, Quota)
    end.

%% The spin ends by the wait's deadline: a reply that comes after it is a timeout.
spin_until(Us, Deadline) ->
    Until = erlang:monotonic_time(microsecond) + Us,
    case Deadline of
        infinity -> Until;
        _ -> min(Until, Deadline * 1000)
    end.

spin(Alias, Deadline, Until) ->
    receive
        {erlcuda, Alias, Result} -> {ok, result(Result)};
        {erlcuda, Alias, {Tag, Value}, Stamps} -> {ok, {Tag, Value, Stamps}}
    after 0 ->
        case erlang:monotonic_time(microsecond) < Until of
            true -> erlang:yield(), spin(Alias, Deadline, Until);
            false -> wait(Alias, Deadline, none)
        end
    end.

wait(Alias, Deadline, Mon) ->
    receive
        {erlcuda, Alias, Result} -> {ok, result(Result)};
        {erlcuda, Alias, {Tag, Value}, Stamps} -> {ok, {Tag, Value, Stamps}};
        {erlcuda_held, Alias, Proxy, Message} -> {held, Proxy, Message};
        {'DOWN', Mon, process, _, Why} -> {down, Why}
    after remaining(Deadline) ->
        timeout
    end.

%% @doc A reply message, as launch_sync returns its content.
-spec message(tuple()) -> term().
message({erlcuda, _, Result}) -> result(Result);
message({erlcuda, _, {Tag, Value}, Stamps}) -> {Tag, Value, Stamps}.

%% @doc The wait is over: a reply that comes within `Ms' more has the buffers in it freed
%% with `Free', and `Alias' is dropped with whatever came through it (a held result is
%% refused: its proxy frees what it names).
-spec drop(reference(), timeout(), fun((term()) -> term())) -> ok.
drop(Alias, Ms, Free) ->
    receive
        {erlcuda, Alias, R} -> _ = Free(R);
        {erlcuda, Alias, R, _} -> _ = Free(R);
        {erlcuda_held, Alias, Proxy, _} -> Proxy ! {erlcuda_cancel, Alias}
    after Ms -> ok
    end,
    unalias(Alias),
    receive
        {erlcuda, Alias, Late} -> _ = Free(Late), ok;
        {erlcuda, Alias, Late, _} -> _ = Free(Late), ok;
        {erlcuda_held, Alias, Held, _} -> Held ! {erlcuda_cancel, Alias}, ok
    after 0 -> ok
    end.

%% @doc A job's result as launch_sync gives it: f32 results, sent as a binary or as the ETF
%% of their floats, become floats in the caller, as do results whose decoding was left to it.
-spec result(term()) -> term().
result({f32, Bin}) -> erlcuda_protocol:f32_list(Bin);
result({floats, Etf}) -> erlcuda_protocol:float_list(Etf);
result({deferred, Raw}) -> erlcuda_protocol:finish(Raw, list);
result(Result) -> Result.

%% @doc erlcuda:await/2 for a job of this node's table: its reply until `Deadline'.
%% `not_here' when the table does not hold it (answered, of another node, or unknown) and
%% the mailbox has no reply for it yet.
-spec job(erlcuda:job_id(), deadline()) -> term() | not_here.
job(Id, Deadline) ->
    case erlcuda_jobs:claim(Id) of
        {ok, Span} ->
            Result = pending(Id, Deadline),
            ok = erlcuda_telemetry:job_stop(Span, Result),
            Result;
        answered ->
            case take(Id, 0) of
                {ok, Result} -> Result;
                timeout -> not_here
            end;
        not_yours ->
            {error, {bad_args, iolist_to_binary(
                                 io_lib:format("job ~b is not this process's: its reply goes "
                                               "to another", [Id]))}}
    end.

pending(Id, Deadline) ->
    case take(Id, remaining(Deadline)) of
        {ok, Result} ->
            Result;
        timeout ->
            case erlcuda_jobs:cancel(Id) of
                %% dropped: never answered
                true -> {error, timeout};
                %% answered as the time ran out: the reply is on its way
                false -> answered(Id, deadline(?LATE_MS))
            end
    end.

%% @doc The reply of a job answered already (or unknown), until `Deadline'.
-spec answered(erlcuda:job_id(), deadline()) -> term().
answered(Id, Deadline) ->
    case take(Id, remaining(Deadline)) of
        {ok, Result} -> Result;
        timeout -> {error, timeout}
    end.

%% @doc The reply of a `launch' `Id' in the mailbox, within `Ms': its result, traced or not.
-spec take(erlcuda:job_id(), timeout()) -> {ok, term()} | timeout.
take(Id, Ms) ->
    receive
        {erlcuda, Id, Result} -> {ok, Result};
        {erlcuda, Id, {Tag, Value}, Stamps} -> {ok, {Tag, Value, Stamps}}
    after Ms ->
        timeout
    end.
