%% @private
%% The worker's wire format, and only this module knows it: how a launch and a control call
%% are framed, what the worker's frames mean, the command line that starts it, the atoms it
%% may send and the hello that checks both sides speak the same version.
%%
%% Frames are `{packet, 4}' on fds 3 and 4, each one term in the external term format, in
%% erlport's shapes:
%%   to the worker:   `{'M', {launch, JobId, ReplyTo, Device, Kernel, Args, Opts}}'
%%                    `{'C', Id, erlcuda, Function, Args}'
%%   from the worker: `{'M', ReplyTo, {erlcuda, JobId, Result}}' (or with a 4th element,
%%                    the trace stamps), `{'r', Id, Reply}', `{'e', Id, Error}',
%%                    `{'L', Level, Text}'.
-module(erlcuda_protocol).

-export([encode_launch/6, encode_call/3, decode/1, worker_command/1, hello_args/0,
         check_hello/1, load_atoms/0]).

-export_type([event/0, command/0]).

-type event() :: {result, erlcuda:job_id(), tuple()}
               | {answer, pos_integer(), {ok, term()} | {error, term()}}
               | {log, logger:level(), unicode:chardata()}
               | {unexpected, term()}
               | {undecodable, non_neg_integer()}.
-type command() :: #{python := file:filename(), args := [string()],
                     env := [{string(), string()}]}.

%% The launch frame's bytes before its arguments and after them, at most.
-define(LAUNCH_OVERHEAD, 256).
-define(LOG_LEVELS, [debug, info, notice, warning, error]).

%% @doc The launch as one frame, built as an iolist: the vectors go into the port's writev
%% as they are, never copied. `too_large' when the frame would not fit its 4-byte length.
-spec encode_launch(JobId :: erlcuda:job_id(), ReplyTo :: pid() | reference(),
                    Device :: non_neg_integer(), Kernel :: atom(),
                    Args :: [binary() | non_neg_integer()], Opts :: map()) ->
    {ok, iolist()} | {error, too_large}.
encode_launch(JobId, ReplyTo, Device, Kernel, Args, Opts) ->
    Payload = lists:sum([byte_size(A) || A <- Args, is_binary(A)]),
    case Payload + ?LAUNCH_OVERHEAD * (1 + length(Args)) > erlcuda_contract:max_frame() of
        true ->
            {error, too_large};
        false ->
            {ok, [<<131, 104, 2, 119, 1, $M, 104, 7, 119, 6, "launch">>,
                  ext(JobId), ext(ReplyTo), ext(Device), ext(Kernel),
                  <<108, (length(Args)):32>>, [arg(A) || A <- Args], <<106>>,
                  ext(Opts)]}
    end.

arg(Bin) when is_binary(Bin) -> [<<109, (byte_size(Bin)):32>>, Bin];
arg(Int) -> ext(Int).

ext(Term) ->
    <<131, Body/binary>> = term_to_binary(Term),
    Body.

%% @doc A control call: the worker answers `{'r', Id, Reply}' or `{'e', Id, Error}'.
-spec encode_call(pos_integer(), atom(), list()) -> binary().
encode_call(Id, Function, Args) ->
    term_to_binary({'C', Id, erlcuda, Function, Args}).

%% @doc What a frame from the worker means. Decoded with `[safe]': the worker can make no
%% atom the node does not already know.
-spec decode(binary()) -> event().
decode(Frame) ->
    try binary_to_term(Frame, [safe]) of
        {'M', _, {erlcuda, JobId, _} = Message} ->
            {result, JobId, Message};
        {'M', _, {erlcuda, JobId, Result, Trace}} when is_map(Trace) ->
            Forward = erlang:monotonic_time(nanosecond),
            {result, JobId, {erlcuda, JobId, Result, Trace#{<<"forward">> => Forward}}};
        {'r', Id, Reply} when is_integer(Id) -> {answer, Id, {ok, Reply}};
        {'e', Id, Error} when is_integer(Id) -> {answer, Id, {error, Error}};
        {'L', Level, Text} when is_binary(Text) -> {log, log_level(Level), Text};
        Other -> {unexpected, Other}
    catch
        error:badarg -> {undecodable, byte_size(Frame)}
    end.

log_level(Level) ->
    case lists:member(Level, ?LOG_LEVELS) of
        true -> Level;
        false -> info
    end.

%% @doc The interpreter, arguments and environment that start the worker.
-spec worker_command(erlcuda_config:config()) -> command().
worker_command(Config) ->
    #{backend := Backend, cpu_devices := CpuDevices, batching := Batching,
      max_batch := MaxBatch, spin_us := SpinUs, worker_args := Extra,
      test_hooks := TestHooks, bench_hooks := BenchHooks, python := Python} = Config,
    Args = ["-m", "erlcuda", "serve", "--backend", atom_to_list(Backend),
            "--cpu-devices", integer_to_list(CpuDevices),
            "--max-batch", integer_to_list(case Batching of true -> MaxBatch; false -> 1 end),
            "--spin-us", case SpinUs of auto -> "-1"; Us -> integer_to_list(Us) end]
        ++ ["--test-hooks" || TestHooks] ++ ["--bench-hooks" || BenchHooks] ++ Extra,
    #{python => erlcuda_paths:python(Python),
      args => Args,
      env => [{"PYTHONPATH", python_path(erlcuda_paths:python_dir())},
              {"PYTHONUNBUFFERED", "1"}]}.

python_path(Ours) ->
    case os:getenv("PYTHONPATH") of
        Path when is_list(Path), Path =/= "" -> Ours ++ ":" ++ Path;
        _ -> Ours
    end.

%% @doc The hello's arguments: this side's version and protocol, which the worker checks.
-spec hello_args() -> [binary() | pos_integer()].
hello_args() ->
    [version(), erlcuda_contract:protocol()].

%% @doc Whether the worker's hello answer lets it take jobs: `ok', or why not.
-spec check_hello(term()) -> ok | {unavailable, binary()} | {failed, term()}.
check_hello(#{backend := _, devices := Devices} = Info)
  when is_integer(Devices), Devices >= 0 ->
    case Devices =< erlcuda_status:max_devices() of
        true -> check_versions(Info);
        false -> {failed, {devices, Devices}}
    end;
check_hello(Other) ->
    {failed, Other}.

check_versions(Info) ->
    Ours = {version(), erlcuda_contract:protocol()},
    Theirs = {maps:get(version, Info, <<"unknown">>), maps:get(protocol, Info, undefined)},
    case {Theirs, maps:get(status, Info, ok)} of
        {Ours, ok} -> ok;
        {Ours, {_, Why}} when is_binary(Why) -> {unavailable, Why};
        {{TheirVersion, TheirProtocol}, _} ->
            {unavailable, iolist_to_binary(
                            io_lib:format("version mismatch: the Erlang side is erlcuda ~ts "
                                          "(protocol ~p), the worker is erlcuda ~ts (protocol "
                                          "~p); install the worker from the same release",
                                          [element(1, Ours), element(2, Ours),
                                           printable(TheirVersion), TheirProtocol]))}
    end.

printable(V) when is_binary(V) -> V;
printable(V) -> io_lib:format("~0p", [V]).

%% @doc Make every atom the worker may send exist, so `[safe]' decoding accepts them.
-spec load_atoms() -> ok.
load_atoms() ->
    _ = erlcuda_contract:worker_atoms(),
    ok.

version() ->
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    list_to_binary(Vsn).
