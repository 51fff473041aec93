%% @private
%% One writer per worker port, for launches that find the port busy. A caller writes its own
%% frame while the port keeps up; once it does not (many callers at once), callers hand their
%% frames to this process, which writes everything queued as one batch frame: a thousand
%% callers then cost the port a few writes instead of a thousand contended ones, and it is
%% this process, not a caller, that waits while the port is busy.
%%
%% Its counters count the frames handed over and not yet written (a caller writes directly
%% only while there are none, so one caller's frames keep their order) and their bytes: past
%% ?MAX_PENDING_BYTES a caller waits until its frame is written, as it would wait on a busy
%% port, so many callers of large jobs cannot pile up gigabytes here.
%%
%% This is the one module that writes the port: a caller's launch (`launch/3', written by
%% the caller itself or handed over), control frames that must keep their place behind the
%% launches (a buffer's `free', `control/2'), and the port owner's calls (`direct/2').
-module(erlcuda_writer).

-export([start_link/1, init/1, new_counters/0, pending/1, backlogged/1, launch/3, hand_over/5,
         hand_over_control/3, control/2, direct/2, stats/1]).

%% counters: frames handed over and not yet written; jobs written here; batch frames written;
%% bytes handed over and not yet written
-define(PENDING, 1).
-define(JOBS, 2).
-define(FRAMES, 3).
-define(BYTES, 4).
-define(MAX_PENDING_BYTES, 67108864).
%% Idle this long, the counters are put right (see loop/2).
-define(IDLE_MS, 1000).
%% A batch frame holds at most this many launches, or about this many bytes.
-define(MAX_JOBS, 1024).
-define(MAX_BYTES, 16777216).

-export_type([counters/0]).

-type counters() :: atomics:atomics_ref().

-spec new_counters() -> counters().
new_counters() ->
    atomics:new(4, [{signed, true}]).

-spec start_link(port()) -> {pid(), counters()}.
start_link(Port) ->
    Counters = new_counters(),
    {proc_lib:spawn_link(?MODULE, init, [{Port, Counters}]), Counters}.

%% @doc Frames handed over and not yet written (at most 0: none).
-spec pending(counters()) -> integer().
pending(Counters) ->
    atomics:get(Counters, ?PENDING).

%% @doc Hand a launch frame of `Size' bytes to the writer, waiting for it to be written when
%% too many bytes are already waiting, at most until `Deadline' (a monotonic time in ms, or
%% `infinity'). `gone' when the writer is gone (its port closed: the frame may never be
%% written), `late' when the deadline passed first (the frame is written later).
-spec hand_over(pid(), counters(), iodata(), non_neg_integer(), integer() | infinity) ->
    ok | gone | late.
hand_over(Writer, Counters, Frame, Size, Deadline) ->
    atomics:add(Counters, ?PENDING, 1),
    case atomics:add_get(Counters, ?BYTES, Size) > ?MAX_PENDING_BYTES of
        false ->
            Writer ! {launch, Frame, Size, none},
            case is_process_alive(Writer) of
                true -> ok;
                false -> gone
            end;
        true ->
            %% The writer answers the monitor's alias: once the caller stops waiting, a
            %% late answer is dropped rather than left in its mailbox.
            Ref = monitor(process, Writer, [{alias, demonitor}]),
            Writer ! {launch, Frame, Size, {Ref, Ref}},
            receive
                {Ref, written} -> demonitor(Ref, [flush]), ok;
                {'DOWN', Ref, process, _, _} -> gone
            after wait_ms(Deadline) ->
                demonitor(Ref, [flush]),
                receive {Ref, written} -> ok
                after 0 -> late
                end
            end
    end.

%% @doc Whether a launch handed over now would wait for the writer (past its byte bound).
-spec backlogged(counters()) -> boolean().
backlogged(Counters) ->
    atomics:get(Counters, ?BYTES) > ?MAX_PENDING_BYTES.

%% @doc Write a launch frame: by the caller itself while nothing waits for the writer and
%% the port is not busy (a lone job pays no hop), else handed to the port's writer. Never
%% suspended; it waits for the writer only past its byte bound, and at most until
%% `Deadline'. `handed' when the writer took it, `closed' when the port or its writer is
%% gone, `late' when the deadline passed first.
-spec launch(erlcuda_status:status(), iodata(), integer() | infinity) ->
    written | handed | closed | late.
launch(#{port := Port, writer := Writer, writer_counters := Counters}, Frame, Deadline) ->
    case now_or_busy(Port, Counters, Frame) of
        true -> written;
        closed -> closed;
        busy ->
            case hand_over(Writer, Counters, Frame, iolist_size(Frame), Deadline) of
                ok -> handed;
                gone -> closed;
                late -> late
            end
    end.

%% @doc Write a control frame that must not overtake the launches written before it (a
%% `free'): to the port at once while the port's writer holds nothing, else through the
%% writer, after what it holds. Only to the worker of `Epoch'; never waits.
-spec control(non_neg_integer(), iodata()) -> ok.
control(Epoch, Frame) ->
    case erlcuda_status:status() of
        #{status := up, epoch := Epoch, port := Port, writer := Writer,
          writer_counters := Counters} ->
            case now_or_busy(Port, Counters, Frame) of
                busy -> hand_over_control(Writer, Counters, Frame);
                _ -> ok
            end;
        _ ->
            ok
    end.

%% A frame written at once only while the writer holds none: one caller's frames keep their
%% order.
now_or_busy(Port, Counters, Frame) ->
    case pending(Counters) of
        P when P =< 0 -> direct(Port, Frame);
        _ -> busy
    end.

%% @doc Write a frame to the port now, never suspended: `true', `busy' (the port queue is
%% over its limit: hand the frame over instead) or `closed'.
-spec direct(port(), iodata()) -> true | busy | closed.
direct(Port, Frame) ->
    try erlang:port_command(Port, Frame, [nosuspend]) of
        true -> true;
        false -> busy
    catch
        error:badarg -> closed
    end.

%% @doc Hand a control frame (a `free') to the writer, to be written alone after the
%% launches it holds. Never waits: the frame is small, and the port owner sends some.
-spec hand_over_control(pid(), counters(), iodata()) -> ok.
hand_over_control(Writer, Counters, Frame) ->
    atomics:add(Counters, ?PENDING, 1),
    Writer ! {control, Frame},
    ok.

wait_ms(infinity) -> infinity;
wait_ms(Deadline) -> max(Deadline - erlang:monotonic_time(millisecond), 0).

%% @doc Jobs written through the writer, and the batch frames that carried them.
-spec stats(counters() | undefined) -> #{jobs := integer(), frames := integer()}.
stats(undefined) ->
    #{jobs => 0, frames => 0};
stats(Counters) ->
    #{jobs => atomics:get(Counters, ?JOBS), frames => atomics:get(Counters, ?FRAMES)}.

-spec init({port(), counters()}) -> no_return().
init({Port, Counters}) ->
    loop(Port, Counters).

loop(Port, Counters) ->
    loop(Port, Counters, none).

%% `Seen': the count of frames handed over and not yet written at the last idle timeout,
%% with nothing received since (`none' otherwise).
loop(Port, Counters, Seen) ->
    receive
        {launch, Frame, Size, Waiter} ->
            gather(Port, Counters, [Frame], Size, 1, [Waiter || Waiter =/= none]);
        {control, Frame} ->
            write_control(Port, Counters, Frame),
            loop(Port, Counters)
    after ?IDLE_MS ->
        loop(Port, Counters, settle(Counters, Seen))
    end.

%% Idle with nothing in the mailbox, a count still up belongs to a caller killed between
%% counting its frame and sending it, or to a caller about to send it. Left, the first would
%% send every later launch through here, and past the byte bound make every caller wait;
%% dropped at once, the second's frame would be written with its count gone, the count
%% would go below the frames held, and callers would write their own frames while this
%% process still holds one of theirs: out of order. So a count is dropped only once it
%% stayed the same over a whole idle period, and only if it is still that (a caller that
%% counts meanwhile keeps it); the next value to remember. A caller held up for over a
%% second between counting and sending (a VM overloaded that long) can still lose its
%% count, and its next frame then overtake the one it sends late.
settle(Counters, Seen) ->
    case pending(Counters) of
        Seen when is_integer(Seen), Seen > 0 ->
            _ = case atomics:compare_exchange(Counters, ?PENDING, Seen, 0) of
                    ok -> atomics:put(Counters, ?BYTES, 0);
                    _ -> ok
                end,
            none;
        P when P > 0 ->
            P;
        _ ->
            none
    end.

%% Everything already queued, without waiting for more, within the bounds of a batch and of
%% a frame (a frame that would not fit starts the next batch).
gather(Port, Counters, Frames, Bytes, N, Waiters) when N < ?MAX_JOBS, Bytes < ?MAX_BYTES ->
    receive
        {launch, Frame, Size, Waiter} ->
            case fits(Bytes + Size, N + 1) of
                true ->
                    gather(Port, Counters, [Frame | Frames], Bytes + Size, N + 1,
                           [Waiter || Waiter =/= none] ++ Waiters);
                false ->
                    write(Port, Counters, Frames, Bytes, N, Waiters),
                    gather(Port, Counters, [Frame], Size, 1, [Waiter || Waiter =/= none])
            end;
        {control, Frame} ->
            %% In order: the launches gathered so far, then the control frame.
            write(Port, Counters, Frames, Bytes, N, Waiters),
            write_control(Port, Counters, Frame),
            loop(Port, Counters)
    after 0 ->
        write(Port, Counters, Frames, Bytes, N, Waiters),
        loop(Port, Counters)
    end;
gather(Port, Counters, Frames, Bytes, N, Waiters) ->
    write(Port, Counters, Frames, Bytes, N, Waiters),
    loop(Port, Counters).

fits(Bytes, N) ->
    Bytes + erlcuda_protocol:batch_overhead(N) =< erlcuda_contract:max_frame().

write(Port, Counters, Frames, Bytes, N, Waiters) ->
    try port_command(Port, erlcuda_protocol:encode_batch(lists:reverse(Frames))) of
        true -> ok
    catch
        %% The port closed: the owner answers every job still registered.
        error:badarg -> ok
    end,
    take(Counters, ?PENDING, N),
    take(Counters, ?BYTES, Bytes),
    atomics:add(Counters, ?JOBS, N),
    atomics:add(Counters, ?FRAMES, 1),
    _ = [To ! {Ref, written} || {To, Ref} <- Waiters],
    ok.

write_control(Port, Counters, Frame) ->
    try port_command(Port, Frame) of
        true -> ok
    catch
        error:badarg -> ok
    end,
    take(Counters, ?PENDING, 1),
    ok.

%% `N' taken off a count, never below zero: a count dropped while idle (settle/2) may have
%% been this very frame's, and one below zero would let callers write their own frames
%% while this process holds others.
take(Counters, Index, N) ->
    case atomics:sub_get(Counters, Index, N) of
        Below when Below < 0 -> atomics:add(Counters, Index, -Below);
        _ -> ok
    end.
