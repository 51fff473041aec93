%% @private
%% The application environment, checked: a bad value stops the application's start with a
%% clear reason, `{bad_config, Key, Value, Allowed}' (Allowed says in words what the key
%% takes), instead of a worker that restarts forever.
%%
%% A key this version does not know (a typo such as `backnd') is not refused but reported:
%% the application's start logs a warning naming it and the known key nearest to it
%% (`unknown/0'). Not refused, because the nodes of a cluster may share one sys.config
%% while they run different versions of erlcuda (during an upgrade), and a key that a
%% newer version reads must not stop an older one.
-module(erlcuda_config).

-export([load/0, keys/0, unknown/0]).

-export_type([config/0]).

%% Timeouts longer than a day are mistakes (and past 2^32 - 1 ms, no timer takes them).
-define(MAX_MS, 86400000).

-type config() :: #{backend := auto | cpu | cuda,
                    cpu_devices := pos_integer(),
                    python := default | string(),
                    batching := boolean(),
                    max_batch := pos_integer(),
                    max_queue := pos_integer(),
                    start_timeout := pos_integer(),
                    watchdog_ms := pos_integer() | infinity,
                    spin_us := auto | non_neg_integer(),
                    caller_spin_us := auto | non_neg_integer(),
                    worker_args := [string()],
                    shm_dir := auto | none | string(),
                    shm_threshold := auto | pos_integer(),
                    shm_keep_ms := pos_integer(),
                    worker_module := string(),
                    python_path := [string()],
                    buffer_limit := pos_integer() | infinity,
                    cluster_exclude := [node()],
                    cluster_prefer := [node()],
                    on_bad_python := retry | fail}.

%% @doc Every key with its default; the `.app.src' documents the same ones.
-spec keys() -> [{atom(), term()}].
keys() ->
    [{backend, auto}, {cpu_devices, 1}, {python, default}, {batching, true},
     {max_batch, 256}, {max_queue, 10000}, {start_timeout, 120000}, {watchdog_ms, 30000},
     {spin_us, auto}, {caller_spin_us, auto}, {worker_args, []}, {shm_dir, auto}, {shm_threshold, auto},
     {shm_keep_ms, 10000},
     {worker_module, "erlcuda"}, {python_path, []},
     {buffer_limit, infinity}, {cluster_exclude, []}, {cluster_prefer, []},
     {on_bad_python, retry}].

%% @doc The checked configuration, or the first key whose value is wrong with what it
%% takes.
-spec load() -> {ok, config()} | {error, {bad_config, atom(), term(), binary()}}.
load() ->
    lists:foldl(fun(_, {error, _} = E) -> E;
                   ({Key, Default}, {ok, Acc}) ->
                        Value = application:get_env(erlcuda, Key, Default),
                        case valid(Key, Value) of
                            true -> {ok, Acc#{Key => text(Key, Value)}};
                            false -> {error, {bad_config, Key, Value, allowed(Key)}}
                        end
                end, {ok, #{}}, keys()).

%% @doc The keys of erlcuda's environment that no version of this one reads, each with the
%% known key nearest to it (`none' where no key is near).
-spec unknown() -> [{atom(), atom() | none}].
unknown() ->
    Known = [K || {K, _} <- keys()],
    [{Key, nearest(Key, Known)}
     || {Key, _} <- lists:sort(application:get_all_env(erlcuda)),
        not lists:member(Key, Known)].

%% What a key takes, in words (for the reason of a value that is wrong).
allowed(backend) -> <<"auto, cpu or cuda">>;
allowed(on_bad_python) -> <<"retry or fail">>;
allowed(python) -> <<"default, or the path of a Python interpreter (text)">>;
allowed(batching) -> <<"true or false">>;
allowed(cpu_devices) ->
    iolist_to_binary(io_lib:format("an integer from 1 to ~b", [erlcuda_status:max_devices()]));
allowed(K) when K =:= start_timeout ->
    iolist_to_binary(io_lib:format("milliseconds, an integer from 1 to ~b", [?MAX_MS]));
allowed(watchdog_ms) ->
    iolist_to_binary(io_lib:format("infinity, or milliseconds, an integer from 1 to ~b",
                                   [?MAX_MS]));
allowed(spin_us) -> <<"auto, or microseconds, an integer of 0 or more">>;
allowed(caller_spin_us) -> <<"auto, or microseconds, an integer from 0 to 10000">>;
allowed(worker_args) -> <<"a list of texts">>;
allowed(shm_dir) -> <<"auto, none, or the path of a folder (text)">>;
allowed(worker_module) ->
    <<"a Python module's dotted name (text), such as \"erlcuda\"">>;
allowed(python_path) -> <<"a list of folders (texts, none empty)">>;
allowed(buffer_limit) -> <<"infinity, or bytes, an integer of 1 or more">>;
allowed(K) when K =:= cluster_exclude; K =:= cluster_prefer -> <<"a list of node names">>;
allowed(_) -> <<"an integer of 1 or more">>.

%% The known key nearest to `Key' by edit distance, where it is near enough to be a typo
%% of it (at most a third of its letters, and at least one, changed); else a key that
%% begins with it, or that it begins with (`watchdog_ms' for `watchdog').
nearest(Key, Known) ->
    Name = atom_to_list(Key),
    Bound = max(1, length(Name) div 3),
    Prefixes = [K || K <- Known, lists:prefix(Name, atom_to_list(K))
                                 orelse lists:prefix(atom_to_list(K), Name)],
    case lists:sort([{distance(Name, atom_to_list(K)), K} || K <- Known]) of
        [{D, K} | _] when D =< Bound -> K;
        _ when Prefixes =/= [] -> hd(lists:sort(Prefixes));
        _ -> none
    end.

%% Levenshtein distance, one row at a time.
distance(A, B) ->
    First = lists:seq(0, length(B)),
    {Last, _} = lists:foldl(
                  fun(CharA, {Prev, I}) ->
                          {row(CharA, B, Prev, [I]), I + 1}
                  end, {First, 1}, A),
    lists:last(Last).

row(_, [], _, Acc) ->
    lists:reverse(Acc);
row(CharA, [CharB | B], [Diag, Up | Prev], [Left | _] = Acc) ->
    Cost = case CharA =:= CharB of true -> 0; false -> 1 end,
    row(CharA, B, [Up | Prev], [min(min(Left + 1, Up + 1), Diag + Cost) | Acc]).

valid(backend, V) -> lists:member(V, [auto, cpu, cuda]);
valid(on_bad_python, V) -> lists:member(V, [retry, fail]);
valid(python, default) -> true;
valid(python, V) -> is_text(V) andalso V =/= [] andalso V =/= <<>>;
valid(watchdog_ms, infinity) -> true;
valid(buffer_limit, infinity) -> true;
valid(spin_us, auto) -> true;
valid(shm_threshold, auto) -> true;
valid(spin_us, V) -> is_integer(V) andalso V >= 0;
valid(caller_spin_us, auto) -> true;
valid(caller_spin_us, V) -> is_integer(V) andalso V >= 0 andalso V =< 10000;
valid(shm_dir, V) when V =:= auto; V =:= none -> true;
valid(shm_dir, V) -> is_text(V) andalso V =/= [] andalso V =/= <<>>;
valid(K, V) when K =:= cluster_exclude; K =:= cluster_prefer ->
    try lists:all(fun is_atom/1, V) catch error:_ -> false end;
valid(worker_args, V) ->
    try lists:all(fun is_text/1, V) catch error:_ -> false end;
valid(python_path, V) ->
    try lists:all(fun(D) -> is_text(D) andalso D =/= [] andalso D =/= <<>> end, V)
    catch error:_ -> false
    end;
valid(worker_module, V) -> is_module_name(V);
valid(batching, V) -> is_boolean(V);
valid(cpu_devices, V) -> is_integer(V) andalso V > 0 andalso V =< erlcuda_status:max_devices();
valid(K, V) when K =:= start_timeout; K =:= watchdog_ms; K =:= shm_keep_ms ->
    is_integer(V) andalso V > 0 andalso V =< ?MAX_MS;
valid(_, V) -> is_integer(V) andalso V > 0.

%% A Python module's dotted name (`-m' runs it): identifiers of ASCII letters, digits and
%% underscores, none starting with a digit.
is_module_name(V) ->
    is_text(V) andalso lists:all(fun is_identifier/1,
                                 string:split(unicode:characters_to_list(V), ".", all)).

is_identifier([C | Rest]) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_ ->
    lists:all(fun(D) -> D >= $a andalso D =< $z orelse D >= $A andalso D =< $Z
                            orelse D >= $0 andalso D =< $9 orelse D =:= $_ end, Rest);
is_identifier(_) -> false.

%% Text as a charlist or, as Elixir writes it, a UTF-8 binary.
is_text(V) when is_binary(V) -> is_list(unicode:characters_to_list(V));
is_text(V) -> io_lib:printable_unicode_list(V).

text(K, V) when is_binary(V), K =:= python; is_binary(V), K =:= shm_dir;
                is_binary(V), K =:= worker_module ->
    unicode:characters_to_list(V);
text(K, V) when K =:= worker_args; K =:= python_path -> [unicode:characters_to_list(A) || A <- V];
text(_, V) -> V.
