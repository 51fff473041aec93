%% @private
%% launch_sync's wait for its one reply, local and remote alike. The reply comes through a
%% process alias made for the one call, so nothing else in the mailbox can match it; once
%% the wait ends the alias is dropped, and a reply that slipped in before that is taken
%% out, so a late result never reaches the caller.
-module(erlcuda_await).

-export([deadline/1, remaining/1, reply/3, drop/3, result/1, message/1]).

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
-spec reply(reference(), deadline(), reference() | none) ->
    {ok, term()} | {held, pid(), tuple()} | {down, term()} | timeout.
reply(Alias, Deadline, Mon) ->
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

%% @doc A job's result as launch_sync gives it: f32 results, sent as a binary, become
%% floats in the caller, as do results whose decoding was left to it.
-spec result(term()) -> term().
result({f32, Bin}) -> erlcuda_protocol:f32_list(Bin);
result({deferred, Raw}) -> erlcuda_protocol:finish(Raw, list);
result(Result) -> Result.
