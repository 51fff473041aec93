%% Helpers shared by the eunit suites.
-module(erlcuda_test_util).

-export([keeper_end_taken/1, wait_restarted/2, stall/2, stall/3, with_app/3, reset/2,
         in_flight/0, wait_until/2, wait_until/3,
         no_message/0, fake_worker/4, test_worker_path/0, wait_for/2, kill9/1, signal/2,
         left/1, flush/0, flush_stalled/0, fault_defaults/0, log/2]).

%% The `python_path' that finds the worker's test double (`worker_module'
%% "erlcuda_testworker": the real worker with the calls fault, print and stall), in
%% test/worker beside this source file.
test_worker_path() ->
    [filename:absname(filename:join(filename:dirname(filename:dirname(?FILE)), "worker"))].

%% The env of the suites that break the worker on purpose: CPU backend, two devices, the
%% worker's test double, a watchdog and start timeout long enough for a loaded machine.
fault_defaults() ->
    [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"},
     {python_path, test_worker_path()}, {max_queue, 10000}, {watchdog_ms, 30000},
     {python, default}, {start_timeout, 120000}].

%% Jobs in flight over every device, as info/0 counts them.
in_flight() ->
    #{device_info := Devices} = erlcuda:info(),
    lists:sum([maps:get(in_flight, D) || D <- Devices]).

%% ok once Cond() holds (N tries, 100 ms apart), else timeout.
wait_until(Cond, N) ->
    wait_until(Cond, N, 100).

%% ok once Cond() holds (N tries, Ms apart), else timeout.
wait_until(_, 0, _) -> timeout;
wait_until(Cond, N, Ms) ->
    case Cond() of
        true -> ok;
        false -> timer:sleep(Ms), wait_until(Cond, N - 1, Ms)
    end.

%% As wait_until/2, but a Cond that raises (info/0 while the port owner restarts, say)
%% counts as not holding yet.
wait_for(_, 0) -> timeout;
wait_for(Cond, N) ->
    case catch Cond() of
        true -> ok;
        _ -> timer:sleep(100), wait_for(Cond, N - 1)
    end.

%% Send signal Sig ("STOP", "CONT", "9", ...) to the OS process OsPid.
signal(OsPid, Sig) ->
    _ = os:cmd("kill -" ++ Sig ++ " " ++ integer_to_list(OsPid) ++ " 2>/dev/null"),
    ok.

kill9(OsPid) -> signal(OsPid, "9").

%% Milliseconds left until Deadline (monotonic milliseconds), never below 0.
left(Deadline) ->
    max(0, Deadline - erlang:monotonic_time(millisecond)).

%% Every message in the caller's mailbox, taken out of it.
flush() ->
    receive M -> [M | flush()] after 0 -> [] end.

%% Take the {stalled, _} that stall/2 sends once its stall ends (waiting up to 6 s).
flush_stalled() ->
    receive {stalled, _} -> ok after 6000 -> ok end.

%% Fails on any message in the caller's mailbox.
no_message() ->
    receive Any -> error({stray, Any}) after 0 -> ok end.

%% An eunit fixture: erlcuda started with Defaults overridden by Env, and afterwards
%% stopped with Defaults restored and every other key Env set removed again.
with_app(Defaults, Env, Test) ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             application:load(erlcuda),
             [ok = application:set_env(erlcuda, K, V) || {K, V} <- Defaults ++ Env],
             {ok, _} = application:ensure_all_started(erlcuda)
     end,
     fun(_) -> reset(Defaults, [K || {K, _} <- Env]) end,
     Test}.

%% Stop erlcuda, set Defaults, and remove the keys in Extra that Defaults does not name.
reset(Defaults, Extra) ->
    _ = application:stop(erlcuda),
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Defaults],
    [ok = application:unset_env(erlcuda, K) || K <- Extra, not lists:keymember(K, 1, Defaults)],
    ok.

%% Wait (N tries, 100 ms apart) until a worker other than OldPid is up.
wait_restarted(_, 0) -> error(not_restarted);
wait_restarted(OldPid, N) ->
    case catch erlcuda:info() of
        #{worker_os_pid := P, worker_status := up} when is_integer(P), P =/= OldPid -> ok;
        _ -> timer:sleep(100), wait_restarted(OldPid, N - 1)
    end.

%% Keep device Device's thread busy for Ms (a call of the worker's test double: the
%% application env names it as worker_module); returns once the device's thread is busy
%% (the double makes a marker file as the stall begins) or the call was answered, and the
%% caller later receives {stalled, Reply}, Reply being erlcuda_worker:call/3's
%% {ok, _} | {error, _}.
stall(Device, Ms) ->
    Self = self(),
    Marker = marker(),
    Caller = spawn(fun() ->
                           Self ! {stalled, erlcuda_worker:call(stall, [Device, Ms, Marker],
                                                                Ms + 5000)}
                   end),
    %% answered (the process that called is done), not any {stalled, _} a test left behind
    stall_begun(Marker, fun() -> not is_process_alive(Caller) end).

%% The same on device Device of node Node, the call cast there.
stall(Node, Device, Ms) ->
    Marker = marker(),
    ok = erpc:cast(Node, erlcuda_worker, call, [stall, [Device, Ms, Marker], Ms + 5000]),
    stall_begun(Marker, fun() -> false end).

%% A marker path no other node has used: unique integers start again in every node, and a
%% marker left by an earlier node's run (made after its stall_begun/2 had returned) would
%% be taken for this stall's beginning.
marker() ->
    Dir = filename:basedir(user_cache, "erlcuda-tests"),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Name = io_lib:format("stall-~s-~b", [os:getpid(), erlang:unique_integer([positive])]),
    unicode:characters_to_binary(filename:join(Dir, Name)).

%% Until the marker is made (then deleted) or Answered() holds, for up to a minute.
stall_begun(Marker, Answered) ->
    Begun = fun() -> filelib:is_regular(Marker) orelse Answered() end,
    ok = wait_until(Begun, 6000, 10),
    _ = file:delete(Marker),
    ok.

%% A stand-in worker (a Python script, to be given as the `python' env) of `Devices'
%% devices: it answers every control call with a valid hello, and every launch `m' (a
%% protocol.Launch) by calling `launch(m)', which `Python' defines (with any helpers it
%% needs: `send(body)' writes one frame, `write(data)' raw bytes, `read(n)' reads n).
fake_worker(Name, Devices, Consts, Python) ->
    _ = application:load(erlcuda),
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    Hello = #{backend => cpu, devices => Devices, status => ok,
              version => list_to_binary(Vsn), protocol => erlcuda_contract:protocol(),
              device_info => [#{jobs => 0, launches => 0, max_batch => 0, errors => 0,
                                queue => 0} || _ <- lists:seq(1, Devices)]},
    <<131, Body/binary>> = term_to_binary(Hello),
    Script = filename:join(string:trim(os:cmd("mktemp -d")), Name),
    ok = file:write_file(Script, [
"#!", erlcuda_paths:python(default), "\n"
"import os, struct, sys, time, zlib\n"
"from erlcuda import protocol, etf\n"
"HELLO = bytes.fromhex('", binary:encode_hex(Body), "')\n",
Consts,
"def read(n):\n"
"    b = bytearray()\n"
"    while len(b) < n:\n"
"        c = os.read(3, n - len(b))\n"
"        if not c:\n"
"            os._exit(0)\n"
"        b += c\n"
"    return bytes(b)\n"
"def write(data):\n"
"    data = memoryview(data)\n"
"    while data:\n"
"        data = data[os.write(4, data):]\n"
"def send(body):\n"
"    write(struct.pack('>I', len(body)) + body)\n",
Python,
"while True:\n"
"    (n,) = struct.unpack('>I', read(4))\n"
"    for m in protocol.decode_all(read(n))[0]:\n"
"        if isinstance(m, protocol.Call):\n"
"            if m.call_id:\n"
"                send(b'\\x83h\\x03w\\x01r' + etf.encode_bytes(m.call_id)[1:] + HELLO)\n"
"        else:\n"
"            launch(m)\n"]),
    ok = file:change_mode(Script, 8#755),
    Script.

%% A logger handler (logger:add_handler(Id, erlcuda_test_util, #{config => #{pid => Pid}}))
%% that sends every event to Pid.
log(Event, #{config := #{pid := Pid}}) ->
    Pid ! {logged, Event},
    ok.

%% A slot's part process has taken its keeper's exit signal (its link gone) and the message
%% it makes of it, or has ended.
keeper_end_taken(Part) ->
    case erlang:process_info(Part, [links, message_queue_len]) of
        undefined -> true;
        [{links, []}, {message_queue_len, 0}] -> true;
        _ -> false
    end.
