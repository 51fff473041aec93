%% @private
%% Whether the configured Python can run the worker, and if not, what to tell the user.
%%
%% A worker that answers its hello has proved its interpreter; one that exits before it is
%% explained by the probe (`python/erlcuda/probe.py'), run with the worker's interpreter
%% and environment as `python -c Source WorkerModule': which Python it is, its version,
%% whether numpy, PyCUDA, the erlcuda package and the worker module import. A Python that
%% cannot serve (not found, too old, no numpy, no erlcuda package) is `{bad_python,
%% Detail}': Detail names the interpreter, where it was chosen from, what is missing, and
%% the fix in one line.
%%
%% Why after a failed start and not before every start: a healthy start then costs nothing
%% more (a second interpreter importing numpy would double the start of every worker), and a
%% stand-in for the interpreter (a wrapper script, the tests' doubles) is never asked to run
%% a script it was not written for. The worker's own output before its hello goes to the
%% logger (`erlcuda.boot'), so the failed start costs no raw traceback on the console.
%% While the answer stays no, the port owner runs only the probe, not the worker.
-module(erlcuda_python).

-export([command/1, choice/1, verdict/4, spawn_failure/2, max_output/0]).

-export_type([choice/0, verdict/0]).

%% The interpreter, and where it was chosen from, in words (erlcuda_paths:python_choice/1).
-type choice() :: {file:filename(), binary()}.
-type verdict() :: ok | {bad_python, binary()}.

-define(PREFIX, <<"erlcuda-probe">>).
%% The probe's output kept, at most: its lines are short; the rest is whatever a
%% non-Python printed.
-define(MAX_OUTPUT, 65536).
%% How much of a non-Python's output a Detail quotes.
-define(QUOTE, 200).
-define(VENV_FIX,
        "Fix: python3 -m venv ~/erlcuda-venv && ~/erlcuda-venv/bin/pip install numpy, then "
        "start the node with ERLCUDA_PYTHON=$HOME/erlcuda-venv/bin/python (or set erlcuda's "
        "python setting to that path)").
-define(PACKAGE_FIX,
        "Fix: build erlcuda again (rebar3 compile copies the package into priv/python), "
        "and check the worker_module and python_path settings").

%% @doc The probe's command: the worker's interpreter and environment, the probe's source
%% (read from the worker's package) given with `-c', the worker module as its argument.
-spec command(erlcuda_config:config()) ->
    {ok, erlcuda_worker_start:command()} | {error, file:posix() | badarg}.
command(#{worker_module := Module} = Config) ->
    #{python := Python, env := Env} = erlcuda_worker_start:worker_command(Config, none),
    case file:read_file(filename:join([erlcuda_paths:python_dir(), "erlcuda", "probe.py"])) of
        {ok, Source} ->
            {ok, #{python => Python, args => ["-c", binary_to_list(Source), Module],
                   env => Env}};
        {error, _} = Error ->
            Error
    end.

%% @doc The configured interpreter and where it was chosen from.
-spec choice(erlcuda_config:config()) -> choice().
choice(#{python := Python}) ->
    erlcuda_paths:python_choice(Python).

%% @doc How much of the probe's output `verdict/4' needs, at most.
-spec max_output() -> pos_integer().
max_output() ->
    ?MAX_OUTPUT.

%% @doc What the probe's exit status and output say of the interpreter.
-spec verdict(choice(), erlcuda_config:config(), integer(), binary()) -> verdict().
verdict(Choice, #{worker_module := Module}, Status, Output) ->
    Found = maps:from_list(
              [{Check, {State, Text}}
               || Line <- binary:split(Output, [<<"\n">>, <<"\r\n">>], [global]),
                  [?PREFIX, Check, State, Text] <- [binary:split(Line, <<"\t">>, [global])]]),
    case Found of
        #{<<"python">> := {_, Version}} ->
            case problems(Found, Module) of
                [] -> ok;
                Problems -> {bad_python, detail(Choice, Version, Problems)}
            end;
        _ ->
            {bad_python, not_python(Choice, Status, Output)}
    end.

%% @doc The verdict on an interpreter that could not be started, where the reason is the
%% interpreter's: `none' for any other (no file descriptors left, say).
-spec spawn_failure(choice(), term()) -> verdict() | none.
spawn_failure({Python, From}, Why) when Why =:= enoent; Why =:= eacces; Why =:= eisdir;
                                       Why =:= enotdir ->
    What = case Why of
               eacces -> "is not executable";
               _ -> "was not found"
           end,
    {bad_python, text("~ts (~ts) ~ts. ~ts", [Python, From, What, ?VENV_FIX])};
spawn_failure(_, _) ->
    none.

%% What keeps the interpreter from serving, each with the fix it needs.
problems(Found, Module) ->
    [Problem || {Check, Format} <- [{<<"python">>, "Python ~ts is too old"},
                                    {<<"numpy">>, "numpy does not import (~ts)"},
                                    {<<"erlcuda">>,
                                     "the erlcuda package does not import (~ts)"},
                                    {<<"module">>, "the worker module " ++ Module
                                     ++ " is not found (~ts)"}],
                Problem <- [problem(Check, Format, Found)], Problem =/= none].

problem(Check, Format, Found) ->
    case maps:get(Check, Found, absent) of
        absent -> none;
        {<<"ok">>, _} -> none;
        {_, Text} -> {fix(Check), text(Format, [Text])}
    end.

fix(Check) when Check =:= <<"python">>; Check =:= <<"numpy">> -> ?VENV_FIX;
fix(_) -> ?PACKAGE_FIX.

detail({Python, From}, Version, Problems) ->
    Fixes = lists:usort([Fix || {Fix, _} <- Problems]),
    text("~ts (~ts, Python ~ts) cannot run the erlcuda worker: ~ts. ~ts",
         [Python, From, hd(string:split(Version, " ")),
          lists:join("; ", [P || {_, P} <- Problems]), lists:join(". ", Fixes)]).

not_python({Python, From}, Status, Output) ->
    Said = case string:trim(binary:part(Output, 0, min(byte_size(Output), ?QUOTE))) of
               <<>> -> "printed nothing";
               Text -> ["printed \"", lists:join(" ", string:lexemes(Text, "\r\n")), "\""]
           end,
    text("~ts (~ts) cannot run the erlcuda worker: it is not a Python that runs erlcuda's "
         "check (exit status ~b, ~ts). ~ts", [Python, From, Status, Said, ?VENV_FIX]).

text(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).
