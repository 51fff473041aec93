%% @private
%% Where the worker's Python code and interpreter are, without hand-set paths. The build
%% copies the package into `priv/python' (see rebar.config), so a release finds it through
%% `code:priv_dir/1' with the source tree out of reach.
-module(erlcuda_paths).

-export([python_dir/0, python/1, python_choice/1]).

%% @doc The directory that holds the `erlcuda' Python package.
-spec python_dir() -> file:filename().
python_dir() ->
    Candidates = [filename:join(Priv, "python") || Priv <- [code:priv_dir(erlcuda)],
                                                    is_list(Priv)]
        ++ [filename:join(source_root(), "python")],
    case [Dir || Dir <- Candidates,
                 filelib:is_regular(filename:join([Dir, "erlcuda", "__init__.py"]))] of
        [Dir | _] -> filename:absname(Dir);
        [] -> filename:absname(hd(Candidates))
    end.

%% The checkout this module was compiled from, where there is one.
source_root() ->
    Source = proplists:get_value(source, ?MODULE:module_info(compile), "."),
    filename:dirname(filename:dirname(Source)).

%% @doc The interpreter: `$ERLCUDA_PYTHON', else the configured one, else the virtual
%% environment that the checkout's set-up made (`make setup'), else `python3' on the PATH.
-spec python(default | string()) -> file:filename().
python(Configured) ->
    element(1, python_choice(Configured)).

%% @doc `python/1' with where it came from, in words, for a message that names it.
-spec python_choice(default | string()) -> {file:filename(), binary()}.
python_choice(Configured) ->
    case os:getenv("ERLCUDA_PYTHON") of
        Env when is_list(Env), Env =/= "" ->
            {executable(Env), <<"from $ERLCUDA_PYTHON">>};
        _ when is_list(Configured) ->
            {executable(Configured), <<"from erlcuda's python setting">>};
        _ ->
            Venv = filename:join([source_root(), ".venv", "bin", "python"]),
            case filelib:is_regular(Venv) of
                true -> {Venv, <<"the checkout's .venv">>};
                false -> {executable("python3"), <<"python3 on the PATH">>}
            end
    end.

executable(Name) ->
    case filename:pathtype(Name) of
        absolute -> Name;
        _ ->
            case os:find_executable(Name) of
                false -> Name;
                Path -> Path
            end
    end.
