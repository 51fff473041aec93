%% @private
%% Where the worker's Python code and interpreter are, without hand-set paths: from the
%% application's directory when erlcuda is a dependency, else from this module's source.
-module(erlcuda_paths).

-export([root/0, python/2]).

%% @doc The project's root: the directory holding `python/erlcuda'.
-spec root() -> file:filename().
root() ->
    Candidates = [code:lib_dir(erlcuda), source_root()],
    case [Dir || Dir <- Candidates, is_list(Dir),
                 filelib:is_regular(filename:join([Dir, "python", "erlcuda", "__init__.py"]))] of
        [Dir | _] -> filename:absname(Dir);
        [] -> filename:absname(source_root())
    end.

source_root() ->
    Source = proplists:get_value(source, ?MODULE:module_info(compile), "."),
    filename:dirname(filename:dirname(Source)).

%% @doc The interpreter: `$ERLCUDA_PYTHON', else the configured one, else the project's
%% virtual environment where the set-up made one, else `python3' from the PATH.
-spec python(file:filename(), default | string()) -> file:filename().
python(Root, Configured) ->
    case os:getenv("ERLCUDA_PYTHON") of
        Env when is_list(Env), Env =/= "" -> executable(Env);
        _ when is_list(Configured) -> executable(Configured);
        _ ->
            Venv = filename:join([Root, ".venv", "bin", "python"]),
            case filelib:is_regular(Venv) of
                true -> Venv;
                false -> executable("python3")
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
